// How a round's phase and a committee score are shown.
// On chain a round is training (updates, then committee scores) -> aggregating (accepted set
// fixed, new global model proposed and confirmed) -> done. The dashboard splits training into
// "training" and "scoring" once the committee's first scores are in.
export const PHASE_STEPS = [
  { key: 'training', label: 'Training', hint: 'trainers submit updates' },
  { key: 'scoring', label: 'Scoring', hint: 'committee scores updates' },
  { key: 'aggregating', label: 'Aggregating', hint: 'accepted set fixed, new model proposed' },
  { key: 'done', label: 'Model fixed', hint: 'global model confirmed on chain' },
]

const SYNONYMS = [
  [/^(open|opened|train|training|submitting|submit)/, 'training'],
  [/^(scor|committee|evaluat)/, 'scoring'],
  [/^(finali[sz]|decided|aggregat|propos|confirm)/, 'aggregating'],
  [/^(done|fixed|complete|finished|model_fixed)/, 'done'],
]

export function normalizePhase(phase) {
  const text = String(phase || '').toLowerCase()
  for (const [pattern, key] of SYNONYMS) if (pattern.test(text)) return key
  return text || 'unknown'
}

// A training round is "scoring" once the committee's first score is in, or once every expected
// trainer submitted (committees score as updates arrive, so the two often coincide).
export function effectivePhase(round, expectedUpdates = 0) {
  const phase = normalizePhase(round?.phase)
  const updates = round?.updates || []
  const scored = updates.some((update) => Object.keys(update.scores || {}).length)
  const allIn = expectedUpdates > 0 && updates.length >= expectedUpdates
  return phase === 'training' && (scored || allIn) ? 'scoring' : phase
}

export function phaseIndex(round, expectedUpdates = 0) {
  return PHASE_STEPS.findIndex((step) => step.key === effectivePhase(round, expectedUpdates))
}

export function isFailedPhase(phase) {
  return /fail|cancel|abort|timeout|expired/.test(String(phase || '').toLowerCase())
}

// Scores are accuracies in basis points on chain (0..10000); older or local ones may be fractions.
export function formatScore(score) {
  if (score == null || Number.isNaN(Number(score))) return '—'
  const value = Number(score)
  const percent = value > 1 ? value / 100 : value * 100
  return `${percent.toFixed(1)}%`
}
