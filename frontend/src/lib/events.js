// Chain events as an operator reads them, in the dashboard's one vocabulary (lib/vocabulary.js):
// privacy in ε (the chain counts micro-ε), scores in percent (basis points on chain), deadlines
// as local dates, nodes by name (the address on hover), hashes shortened, lists summarized.
import { shortHash } from './format.js'
import { epsilon, moment, nodeLabel, percent } from './vocabulary.js'

const MICRO_EPSILON_ARGS = new Set(['amount', 'jobTotal', 'datasetTotal', 'privacyCap', 'maxSpendPerRound'])
const BASIS_POINT_ARGS = new Set(['baseScore', 'baseMedian', 'margin', 'score', 'median'])
const BASIS_POINT_LISTS = new Set(['scores', 'medians'])
const TIME_ARGS = new Set(['joinDeadline', 'updateDeadline', 'scoreDeadline', 'aggregateDeadline', 'deadline'])
const HIDDEN_ARGS = new Set(['wrappedKey', 'spec', 'pubkey', 'seed', 'salt', 'commitment'])
const HEX = /^0x[0-9a-fA-F]+$/
const ADDRESS = /^0x[0-9a-fA-F]{40}$/

export function formatArg(key, value, names = {}) {
  if (value == null) return '—'
  if (MICRO_EPSILON_ARGS.has(key) && !Number.isNaN(Number(value))) return epsilon(value)
  if (BASIS_POINT_ARGS.has(key) && !Number.isNaN(Number(value))) return percent(value)
  if (TIME_ARGS.has(key) && Number(value) > 0) return moment(value)
  if (BASIS_POINT_LISTS.has(key) && Array.isArray(value)) return value.map((score) => percent(score)).join(' ')
  if (Array.isArray(value)) return value.length > 3 ? `${value.length} entries` : value.map((item) => formatArg('', item, names)).join(' ')
  if (typeof value === 'object') return '{…}'
  const text = String(value)
  if (ADDRESS.test(text) && names[text.toLowerCase()]) return nodeLabel(text, names)
  return HEX.test(text) && text.length > 18 ? shortHash(text, 4) : text
}

export function describeArgs(args, names = {}) {
  return Object.entries(args || {})
    .filter(([key]) => !HIDDEN_ARGS.has(key))
    .map(([key, value]) => `${key} ${formatArg(key, value, names)}`)
    .join(' · ')
}
