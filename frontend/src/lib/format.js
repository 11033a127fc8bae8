// Small display helpers shared by the pages.
export function shortHash(value, keep = 6) {
  if (!value) return '—'
  const text = String(value)
  return text.length <= 2 * keep + 3 ? text : `${text.slice(0, keep + 2)}…${text.slice(-keep)}`
}

export function formatBytes(bytes) {
  if (bytes == null || Number.isNaN(Number(bytes))) return '—'
  const units = ['B', 'KB', 'MB', 'GB', 'TB']
  let value = Number(bytes)
  let unit = 0
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024
    unit += 1
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`
}

export function formatNumber(value, digits = 2) {
  if (value == null || value === '' || Number.isNaN(Number(value))) return '—'
  return Number(value).toFixed(digits)
}

export function formatTime(value) {
  if (!value) return '—'
  const date = typeof value === 'number' ? new Date(value * (value < 1e12 ? 1000 : 1)) : new Date(value)
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString()
}

export function timeAgo(value, now = Date.now()) {
  if (!value) return 'never'
  const date = typeof value === 'number' ? new Date(value * (value < 1e12 ? 1000 : 1)) : new Date(value)
  const seconds = Math.round((now - date.getTime()) / 1000)
  if (Number.isNaN(seconds)) return String(value)
  if (seconds < 60) return `${Math.max(seconds, 0)} s ago`
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`
  return `${Math.round(seconds / 86400)} d ago`
}
