// The signed-in user and their API token, kept in localStorage: every tab of this node's
// origin shares it (a link opened in a new tab is signed in too) and it survives a reload.
// Not a cookie: several nodes on one host (127.0.0.1:8101, :8102, ...) would overwrite each
// other's cookies (cookies ignore the port), while storage is per origin. Requests carry the
// token in the Authorization header, which another site cannot make the browser send (no CSRF).
// A sign-in or sign-out in one tab reaches the others through the `storage` event; the token
// expires on the node (DEFL_TOKEN_TTL_S). Each sign-in (a browser, a device) has a token of its own:
// signing out ends this browser's login in all its tabs, never the user's other devices or scripts.
import { reactive, readonly } from 'vue'

const STORAGE_KEY = 'defl.session'

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORAGE_KEY) || 'null')
    if (saved && typeof saved.token === 'string' && saved.user) return { token: saved.token, user: saved.user }
  } catch {
    // a corrupt entry (or blocked storage) is the same as no session
  }
  return { token: null, user: null }
}

const state = reactive(load())

export const session = readonly(state)

function save() {
  try {
    if (state.token) localStorage.setItem(STORAGE_KEY, JSON.stringify({ token: state.token, user: state.user }))
    else localStorage.removeItem(STORAGE_KEY)
  } catch {
    // storage blocked: the session lasts as long as this tab
  }
}

export function setSession(token, user) {
  state.token = token
  state.user = user ? { username: user.username, role: user.role } : null
  save()
}

export function clearSession() {
  state.token = null
  state.user = null
  save()
}

export function isSignedIn() {
  return Boolean(state.token)
}

// Another tab signed in or out: follow it.
const listeners = []
export function onSessionChange(listener) {
  listeners.push(listener)
}
if (typeof window !== 'undefined') {
  window.addEventListener('storage', (event) => {
    if (event.key !== STORAGE_KEY && event.key !== null) return
    Object.assign(state, load())
    for (const listener of listeners) listener(state)
  })
}
