// A privacy budget's parts for display. The API's `budget` block (GET /api/datasets/{id}):
// epsilon_cap, epsilon_spent, epsilon_reserved (jobs in progress), epsilon_left.
const clampPct = (value) => Math.min(Math.max(value, 0), 100)

export function budgetParts(budget) {
  const cap = Math.max(Number(budget?.epsilon_cap) || 0, 0)
  const spent = Math.max(Number(budget?.epsilon_spent) || 0, 0)
  const reserved = Math.max(Number(budget?.epsilon_reserved) || 0, 0)
  const left = budget?.epsilon_left != null ? Math.max(Number(budget.epsilon_left), 0) : Math.max(cap - spent - reserved, 0)
  const spentPct = cap > 0 ? clampPct((100 * spent) / cap) : spent > 0 ? 100 : 0
  const reservedPct = cap > 0 ? clampPct((100 * reserved) / cap) : 0
  const usedPct = clampPct(spentPct + Math.min(reservedPct, 100 - spentPct))
  const level = usedPct >= 90 ? 'danger' : usedPct >= 70 ? 'warn' : 'ok'
  return { cap, spent, reserved, left, spentPct, reservedPct: Math.min(reservedPct, 100 - spentPct), usedPct, level }
}

// Why a dataset's total is not the sum of its jobs' shares (unless the node explains it itself).
export const COMPOSITION_NOTE =
  'The total is composed over every release of this dataset at once (Rényi DP accounting), which is tighter than adding up each job\'s own ε: the jobs\' shares can sum to more than the total.'
