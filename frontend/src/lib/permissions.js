// What each role may do, mirroring docs/API.md: operators everything, providers
// datasets and grants, viewers read only. The UI hides what a role may not do;
// the API enforces it anyway (403).
const ACTIONS = {
  'datasets:write': ['operator', 'provider'],
  'grants:write': ['operator', 'provider'],
  'jobs:write': ['operator'],
  'models:predict': ['operator', 'provider', 'viewer'],
  'users:manage': ['operator'],
}

export function can(role, action) {
  const allowed = ACTIONS[action]
  if (!allowed) throw new Error(`unknown action ${action}`)
  return allowed.includes(role)
}
