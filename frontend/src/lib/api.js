// The node's REST API (docs/API.md). Every call goes through one axios instance that
// adds the token (lib/session.js) and turns failures into ApiError; a 401 ends the session.
import axios from 'axios'
import { clearSession, session } from './session.js'

export class ApiError extends Error {
  constructor(status, detail, errors = {}) {
    super(detail)
    this.status = status
    this.detail = detail
    this.errors = errors
  }
}

const http = axios.create({ baseURL: '/api', timeout: 60000 })

http.interceptors.request.use((config) => {
  if (session.token) config.headers.Authorization = `Token ${session.token}`
  return config
})

let onUnauthorized = () => {}
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler
}

function toApiError(error) {
  if (!error.response) {
    return new ApiError(0, error.code === 'ECONNABORTED' ? 'The node did not answer in time.' : 'The node cannot be reached.')
  }
  const { status, data } = error.response
  const body = data && typeof data === 'object' && !(data instanceof Blob) ? data : {}
  const detail = body.detail || (status >= 500 ? `The node failed (HTTP ${status}).` : `Request failed (HTTP ${status}).`)
  return new ApiError(status, String(detail), body.errors || {})
}

http.interceptors.response.use(
  (response) => response,
  (error) => {
    const apiError = toApiError(error)
    if (apiError.status === 401 && !error.config?.skipAuthRedirect) {
      clearSession()
      onUnauthorized()
    }
    return Promise.reject(apiError)
  },
)

const data = (promise) => promise.then((response) => response.data)
// List endpoints may be paginated ({results: [...]}) or plain arrays.
const list = (promise) => data(promise).then((body) => (Array.isArray(body) ? body : body?.results ?? []))

export const api = {
  login: (username, password) => data(http.post('/auth/login', { username, password }, { skipAuthRedirect: true })),
  // Ends this device's login only: the user's other devices and scripts keep theirs.
  logout: () => data(http.post('/auth/logout', null, { skipAuthRedirect: true })),
  me: () => data(http.get('/auth/me')),

  // Accounts: operators manage users; everyone their own logins (devices) and script tokens.
  users: () => list(http.get('/users')),
  createUser: (body) => data(http.post('/users', body)),
  updateUser: (id, body) => data(http.patch(`/users/${id}`, body)),
  tokens: (params = {}) => list(http.get('/tokens', { params })),
  createToken: (body) => data(http.post('/tokens', body)),
  revokeToken: (id) => data(http.delete(`/tokens/${id}`)),

  node: () => data(http.get('/node')),
  peers: () => list(http.get('/peers')),
  events: (limit = 20) => list(http.get('/events', { params: { limit } })),

  datasets: () => list(http.get('/datasets')),
  dataset: (id) => data(http.get(`/datasets/${id}`)),
  uploadDataset: (form, onProgress) =>
    data(
      http.post('/datasets', form, {
        timeout: 0,
        onUploadProgress: (event) => onProgress?.(event.total ? Math.round((100 * event.loaded) / event.total) : 0),
      }),
    ),
  grants: (id) => list(http.get(`/datasets/${id}/grants`)),
  grant: (id, node) => data(http.post(`/datasets/${id}/grants`, { node })),
  revoke: (id, node) => data(http.delete(`/datasets/${id}/grants/${encodeURIComponent(node)}`)),

  jobs: () => list(http.get('/jobs')),
  job: (id) => data(http.get(`/jobs/${id}`)),
  jobLimits: () => data(http.get('/jobs/limits')),
  createJob: (body) => data(http.post('/jobs', body)),
  joinJob: (id, dataset) => data(http.post(`/jobs/${id}/join`, { dataset })),
  startJob: (id) => data(http.post(`/jobs/${id}/start`)),
  cancelJob: (id) => data(http.post(`/jobs/${id}/cancel`)),
  rounds: (id) => list(http.get(`/jobs/${id}/rounds`)),
  jobTasks: (id) => data(http.get(`/jobs/${id}/tasks`)),
  cancelTask: (id, task) => data(http.post(`/jobs/${id}/tasks/${task}/cancel`)),
  setJobPriority: (id, priority) => data(http.post(`/jobs/${id}/tasks/priority`, { priority })),
  cluster: () => data(http.get('/cluster')),

  overview: () => data(http.get('/dashboard/overview')),
  joinCandidates: () => data(http.get('/dashboard/join-candidates')),
  grantedDatasets: () => list(http.get('/dashboard/granted-datasets')),
  modelCatalog: () => list(http.get('/dashboard/models')),

  models: () => list(http.get('/models')),
  model: (id) => data(http.get(`/models/${id}`)),
  downloadModel: (id) => data(http.get(`/models/${id}/download`, { responseType: 'blob', timeout: 0 })),
  predict: (id, inputs) => data(http.post(`/models/${id}/predict`, { inputs })),
}
