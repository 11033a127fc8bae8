// The three roles of a node's users, as the users page offers them (backend/identity/roles.py).
export const ROLES = [
  { value: 'operator', label: 'operator: runs the node and its jobs' },
  { value: 'provider', label: 'data provider: uploads and grants datasets' },
  { value: 'viewer', label: 'viewer: reads everything, changes nothing' },
]
