// Can a job with these numbers start on this federation? The contract starts a job only with
// committee_size + min_trainers participants, and a node can join only with a dataset of the
// job's schema that it owns or was granted, whose privacy budget still covers the job's target ε.
// The node checks the same before anything goes on chain (backend/jobs_api/services.py, a 409
// naming the field); the form says it first, beside the field that causes it.

const bare = (hash) => String(hash || '').toLowerCase().replace(/^0x/, '')

// candidates: GET /api/dashboard/join-candidates ->
//   { address, allow_small_committees, members: [{ address, name, self, datasets: [{ id, schema_hash, epsilon_left }] }] }
// schemaHash: the chosen dataset's schema (null: any schema counts).
export function joinableMembers(candidates, targetEpsilon, schemaHash = null) {
  const need = Number(targetEpsilon) > 0 ? Number(targetEpsilon) : 0
  const fits = (dataset) =>
    (dataset.epsilon_left == null || Number(dataset.epsilon_left) >= need) &&
    (!schemaHash || !dataset.schema_hash || bare(dataset.schema_hash) === bare(schemaHash))
  return (candidates?.members || []).filter((member) => (member.datasets || []).some(fits))
}

const names = (members) => members.map((member) => member.name || member.address).join(', ')

// The most records a job's delta may protect: delta <= 1/(10 n) for a dataset of n records.
export function deltaLimit(records) {
  const n = Number(records)
  return n > 0 ? 1 / (10 * n) : null
}

// Returns { ok, joinable, needed, problems: [{ field, message }] }; `ok` is true when nothing blocks.
// dataset: the chosen dataset of this node ({ num_samples, schema_hash, budget }) or null.
export function checkJobPlan(form, candidates, ownBudgetLeft, dataset = null) {
  const problems = []
  const target = Number(form.dp?.target_epsilon)
  const committee = Number(form.committee_size) || 0
  const minTrainers = Number(form.min_trainers) || 0
  const topK = Number(form.top_k) || 0
  const needed = committee + minTrainers
  const limit = deltaLimit(dataset?.num_samples)
  if (limit != null && Number(form.dp?.delta) > limit) {
    problems.push({
      field: 'dp.delta',
      message: `δ must be at most 1/(10·n) = ${formatDelta(limit)} for the ${dataset.num_samples} records of "${dataset.name}".`,
    })
  }
  if (ownBudgetLeft != null && target > Number(ownBudgetLeft)) {
    problems.push({ field: 'dp.target_epsilon', message: `Only ε ${Number(ownBudgetLeft).toFixed(2)} is left in this node's dataset: lower the target ε or pick another dataset.` })
  }
  if (!candidates) return { ok: problems.length === 0, joinable: null, needed, problems }
  if (candidates.allow_small_committees === false && (committee < 3 || committee % 2 === 0)) {
    problems.push({ field: 'committee_size', message: 'This deployment takes committees of an odd size, at least 3.' })
  }
  const joinable = joinableMembers(candidates, target, dataset?.schema_hash)
  const count = joinable.length
  if (committee >= count) {
    problems.push({ field: 'committee_size', message: `A committee of ${committee} leaves no trainer among the ${count} member(s) that can join.` })
  } else if (needed > count) {
    problems.push({
      field: 'min_trainers',
      message: `Starting needs ${needed} participants (committee ${committee} + at least ${minTrainers} trainers), but only ${count} member(s) can join with ε ${target} left: ${names(joinable) || 'none'}. At most ${Math.max(count - committee, 0)} minimum trainers.`,
    })
  }
  const trainers = count - committee
  if (trainers > 0 && topK > trainers) {
    problems.push({ field: 'top_k', message: `Top-k ${topK} is more than the ${trainers} trainer(s) a round can have.` })
  }
  return { ok: problems.length === 0, joinable, needed, problems }
}

// The smallest committee a production deployment accepts (odd and at least 3: a committee of 1 or 2
// lets one member fix models and carry medians). A development deployment (the node says so in
// join-candidates' allow_small_committees) also takes a committee of 1.
export const DEFAULT_COMMITTEE = 3

// Numbers that start on this federation: a committee of 3 (of 1 on a development deployment with
// fewer than five members), up to 2 minimum trainers, top-k up to 3. null when too few can join.
export function fittingDefaults(candidates, targetEpsilon, schemaHash = null) {
  const count = joinableMembers(candidates, targetEpsilon, schemaHash).length
  const small = candidates?.allow_small_committees === true
  const committee = small && count < DEFAULT_COMMITTEE + 2 ? 1 : DEFAULT_COMMITTEE
  const trainers = count - committee
  if (trainers < 1) return null
  return { committee_size: committee, min_trainers: Math.min(trainers, 2), top_k: Math.max(1, Math.min(trainers, 3)) }
}

// A delta as a person writes it: 1e-7, 1.2e-5 (never 0.000000).
export function formatDelta(value) {
  const number = Number(value)
  if (!Number.isFinite(number)) return String(value ?? '')
  if (number === 0) return '0'
  const [mantissa, exponent] = number.toExponential(2).split('e')
  const trimmed = String(Number(mantissa))
  return `${trimmed}e${Number(exponent)}`
}

// A delta the operator typed ("1e-7", "0.00001", "1.5E-6"), or NaN.
export function parseDelta(text) {
  const trimmed = String(text ?? '').trim()
  if (!/^[0-9]*\.?[0-9]+(e-?[0-9]+)?$/i.test(trimmed)) return Number.NaN
  return Number(trimmed)
}

// The largest "nice" delta (1, 2 or 5 times a power of ten) within 1/(10 n), at most 1e-5.
export function suggestedDelta(records) {
  const limit = Math.min(deltaLimit(records) ?? 1e-5, 1e-5)
  const exponent = Math.floor(Math.log10(limit))
  for (const step of [5, 2, 1]) {
    const value = step * 10 ** exponent
    if (value <= limit) return Number(value.toPrecision(1))
  }
  return limit
}
