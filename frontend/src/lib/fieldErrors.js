// Flattens the API's {"errors": {field: [msg]}} (possibly nested: {"dp": {"target_epsilon": [...]}})
// into {"dp.target_epsilon": "msg ..."} so form items can look their error up by path.
export function flattenErrors(errors, prefix = '') {
  const flat = {}
  if (!errors || typeof errors !== 'object') return flat
  for (const [key, value] of Object.entries(errors)) {
    const path = prefix ? `${prefix}.${key}` : key
    if (Array.isArray(value)) {
      if (value.every((item) => typeof item === 'string')) flat[path] = value.join(' ')
      else value.forEach((item, index) => Object.assign(flat, flattenErrors(item, `${path}.${index}`)))
    } else if (value && typeof value === 'object') {
      Object.assign(flat, flattenErrors(value, path))
    } else if (value != null) {
      flat[path] = String(value)
    }
  }
  return flat
}
