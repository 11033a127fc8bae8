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

// A time before or after now as a person says it: "3 minutes ago", "in 3 minutes", "just now".
export function fromNow(value, now = Date.now()) {
  if (!value && value !== 0) return '—'
  const date = typeof value === 'number' ? new Date(value * (value < 1e12 ? 1000 : 1)) : new Date(value)
  const seconds = Math.round((date.getTime() - now) / 1000)
  if (Number.isNaN(seconds)) return String(value)
  const size = Math.abs(seconds)
  if (size < 10) return 'just now'
  const [unit, count] =
    size < 60 ? ['second', size] : size < 3600 ? ['minute', Math.round(size / 60)] : size < 86400 ? ['hour', Math.round(size / 3600)] : ['day', Math.round(size / 86400)]
  const text = `${count} ${unit}${count === 1 ? '' : 's'}`
  return seconds > 0 ? `in ${text}` : `${text} ago`
}

// A moment as a local date and time, with how far it is from now: "5 Dec 2026, 14:03 (in 3 minutes)".
export function whenText(value, now = Date.now()) {
  if (!value && value !== 0) return '—'
  return `${formatTime(value)} (${fromNow(value, now)})`
}
