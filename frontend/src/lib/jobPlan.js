// Can a job with these numbers start on this federation? The contract starts a job only with
// committee_size + min_trainers participants, and a node can join only with a dataset it owns or
// was granted whose privacy budget still covers the job's target ε. Checked before anything
// goes on chain, so the wizard never proposes a job that would be refused at Start.

// candidates: GET /api/dashboard/join-candidates -> { address, members: [{ address, name, self, datasets: [{ id, epsilon_left }] }] }
export function joinableMembers(candidates, targetEpsilon) {
  const need = Number(targetEpsilon) > 0 ? Number(targetEpsilon) : 0
  return (candidates?.members || []).filter((member) =>
    (member.datasets || []).some((dataset) => dataset.epsilon_left == null || Number(dataset.epsilon_left) >= need),
  )
}

const names = (members) => members.map((member) => member.name || member.address).join(', ')

// Returns { ok, joinable, needed, problems: [{ field, message }] }; `ok` is true when nothing blocks.
export function checkJobPlan(form, candidates, ownBudgetLeft) {
  const problems = []
  const private_ = form.dp?.mode && form.dp.mode !== 'none'
  const target = private_ ? Number(form.dp.target_epsilon) : 0
  const committee = Number(form.committee_size) || 0
  const minTrainers = Number(form.min_trainers) || 0
  const topK = Number(form.top_k) || 0
  const needed = committee + minTrainers
  if (private_ && ownBudgetLeft != null && target > Number(ownBudgetLeft)) {
    problems.push({ field: 'dp.target_epsilon', message: `Only ε ${Number(ownBudgetLeft).toFixed(2)} is left in this node's dataset: lower the target ε or pick another dataset.` })
  }
  if (!candidates) return { ok: problems.length === 0, joinable: null, needed, problems }
  const joinable = joinableMembers(candidates, target)
  const count = joinable.length
  if (needed > count) {
    problems.push({
      field: 'min_trainers',
      message: `Starting needs ${needed} participants (committee ${committee} + at least ${minTrainers} trainers), but only ${count} member(s) can join${private_ ? ` with ε ${target} left` : ''}: ${names(joinable) || 'none'}.`,
    })
  }
  if (committee >= count && count > 0) {
    problems.push({ field: 'committee_size', message: `A committee of ${committee} leaves no trainer among the ${count} member(s) that can join.` })
  }
  const trainers = count - committee
  if (trainers > 0 && topK > trainers) {
    problems.push({ field: 'top_k', message: `Top-k ${topK} is more than the ${trainers} trainer(s) a round can have.` })
  }
  return { ok: problems.length === 0, joinable, needed, problems }
}

// The smallest committee a production deployment accepts (odd and at least 3: a committee of 1 or 2
// lets one member fix models and carry medians). Smaller ones only on a development deployment,
// which the node does not report: there the operator lowers it and the API's 400 speaks otherwise.
export const DEFAULT_COMMITTEE = 3

// Numbers that fit the federation: a committee of DEFAULT_COMMITTEE, every other joinable member
// trains. null when fewer than DEFAULT_COMMITTEE + 1 members can join (the plan then says why).
export function fittingDefaults(candidates, targetEpsilon) {
  const count = joinableMembers(candidates, targetEpsilon).length
  if (count <= DEFAULT_COMMITTEE) return null
  const trainers = count - DEFAULT_COMMITTEE
  return { committee_size: DEFAULT_COMMITTEE, min_trainers: trainers, top_k: Math.max(1, Math.min(trainers, 3)) }
}
