// One vocabulary for the whole dashboard: scores as percentages (the chain counts basis points),
// privacy in ε (the chain counts micro-ε), on-chain times as local dates with "in 3 minutes",
// datasets as "name #id" (their on-chain id; a name where this node knows it), nodes by name.
import { formatTime, fromNow } from './format.js'

export const percent = (bp) => (bp == null || Number.isNaN(Number(bp)) ? '—' : `${(Number(bp) / 100).toFixed(1)}%`)

export const epsilon = (micro) => `ε ${(Number(micro) / 1e6).toFixed(3)}`

// A Unix time (seconds, the chain's clock) as a local date and how far from now.
export const moment = (seconds, now = Date.now()) => (seconds ? `${formatTime(Number(seconds))} (${fromNow(Number(seconds), now)})` : '—')

export function datasetLabel(id, name = '') {
  if (id == null || id === '') return '—'
  return name ? `${name} #${id}` : `#${id}`
}

export function nodeLabel(address, names = {}) {
  const name = names[String(address || '').toLowerCase()]
  return name || String(address || '—')
}

export const gasText = (gas) => (gas == null ? '…' : Number(gas).toLocaleString('en-US'))
