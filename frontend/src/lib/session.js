// Who is signed in. The credential is the node's session cookie (HttpOnly, set by
// POST /api/auth/login), shared by every tab of the browser: a link opened in a new tab is
// signed in too, and no script can read the credential. Writes carry the CSRF cookie's value
// in X-CSRFToken (lib/api.js), so another site cannot make the browser act for the user.
// This module keeps only the user's name and role, restored once per tab from /api/auth/me.
import { reactive, readonly } from 'vue'

const state = reactive({ user: null, restored: false })
// A hint, not a credential: "some tab of this browser signed in". Without it a new tab goes
// straight to the sign-in page instead of asking the node (and logging a 401).
const HINT_KEY = 'defl.signed-in'
const hint = {
  get: () => {
    try {
      return localStorage.getItem(HINT_KEY) === '1'
    } catch {
      return true // storage blocked: ask the node
    }
  },
  set: (on) => {
    try {
      if (on) localStorage.setItem(HINT_KEY, '1')
      else localStorage.removeItem(HINT_KEY)
    } catch {
      // storage blocked: the hint only saves a request
    }
  },
}

export const session = readonly(state)

export function setSession(user) {
  state.user = user ? { username: user.username, role: user.role } : null
  state.restored = true
  hint.set(Boolean(state.user))
}

export function clearSession() {
  state.user = null
  state.restored = true
  hint.set(false)
}

export function isSignedIn() {
  return Boolean(state.user)
}

// A new tab asks the node once whether its cookie still signs someone in.
let pending = null
export function restoreSession(fetchMe) {
  if (state.restored) return Promise.resolve(state.user)
  if (!hint.get()) {
    state.restored = true
    return Promise.resolve(null)
  }
  pending ??= fetchMe()
    .then((user) => setSession(user))
    .catch(() => clearSession())
    .then(() => state.user)
    .finally(() => {
      pending = null
    })
  return pending
}

// Tests (and a sign-out) start from "not known yet".
export function forgetSession() {
  state.user = null
  state.restored = false
}
