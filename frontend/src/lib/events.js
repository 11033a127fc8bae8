// Chain events as an operator reads them: privacy in ε (the chain counts micro-ε), scores in
// percent (basis points on chain), addresses and hashes shortened, lists summarized.
import { shortHash } from './format.js'

const MICRO_EPSILON_ARGS = new Set(['amount', 'jobTotal', 'datasetTotal', 'privacyCap', 'maxSpendPerRound'])
const HIDDEN_ARGS = new Set(['wrappedKey', 'spec', 'pubkey'])
const HEX = /^0x[0-9a-fA-F]+$/

export function formatArg(key, value) {
  if (value == null) return '—'
  if (MICRO_EPSILON_ARGS.has(key) && !Number.isNaN(Number(value))) return `ε ${(Number(value) / 1e6).toFixed(3)}`
  if (key === 'scores' && Array.isArray(value)) return value.map((score) => `${(Number(score) / 100).toFixed(1)}%`).join(' ')
  if (Array.isArray(value)) return value.length > 3 ? `${value.length} entries` : value.map((item) => formatArg('', item)).join(' ')
  if (typeof value === 'object') return '{…}'
  const text = String(value)
  return HEX.test(text) && text.length > 18 ? shortHash(text, 4) : text
}

export function describeArgs(args) {
  return Object.entries(args || {})
    .filter(([key]) => !HIDDEN_ARGS.has(key))
    .map(([key, value]) => `${key} ${formatArg(key, value)}`)
    .join(' · ')
}
