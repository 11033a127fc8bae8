// The signed-in user and their API token, kept in sessionStorage so a tab's sign-in
// survives reloads but not the browser session.
import { reactive, readonly } from 'vue'

const STORAGE_KEY = 'defl.session'

function load() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(STORAGE_KEY) || 'null')
    if (saved && saved.token && saved.user) return saved
  } catch {
    // a corrupt entry is the same as no session
  }
  return { token: null, user: null }
}

const state = reactive(load())

export const session = readonly(state)

export function setSession(token, user) {
  state.token = token
  state.user = user
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ token, user }))
}

export function clearSession() {
  state.token = null
  state.user = null
  sessionStorage.removeItem(STORAGE_KEY)
}

export function isSignedIn() {
  return Boolean(state.token)
}
