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

export function effectivePhase(round) {
  const phase = normalizePhase(round?.phase)
  const scored = (round?.updates || []).some((update) => Object.keys(update.scores || {}).length)
  return phase === 'training' && scored ? 'scoring' : phase
}

export function phaseIndex(round) {
  return PHASE_STEPS.findIndex((step) => step.key === effectivePhase(round))
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
