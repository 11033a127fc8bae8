import { describe, it, expect } from 'vitest'
import { checkJobPlan, fittingDefaults, joinableMembers } from '../src/lib/jobPlan.js'

const member = (name, left, self = false) => ({ address: `0x${name}`, name, self, datasets: left == null ? [] : [{ id: 1, epsilon_left: left }] })
const threeNodes = { address: '0xa', members: [member('a', 10, true), member('b', 10), member('c', 10)] }
const form = (over = {}) => ({ committee_size: 1, top_k: 2, min_trainers: 2, dp: { mode: 'sgd', target_epsilon: 3 }, ...over })

describe('job plan', () => {
  it('refuses the old defaults on three nodes: committee 2 + 2 trainers need four', () => {
    const plan = checkJobPlan(form({ committee_size: 2, top_k: 3 }), threeNodes, 10)
    expect(plan.ok).toBe(false)
    expect(plan.needed).toBe(4)
    expect(plan.problems.map((p) => p.field)).toEqual(['min_trainers', 'top_k'])
    expect(plan.problems[0].message).toContain('only 3 member(s) can join')
  })

  it('accepts a plan the federation can start', () => {
    expect(checkJobPlan(form(), threeNodes, 10)).toMatchObject({ ok: true, needed: 3, problems: [] })
  })

  it('counts only members whose datasets have the target ε left', () => {
    const federation = { members: [member('a', 10), member('b', 1), member('c', null)] }
    expect(joinableMembers(federation, 3).map((m) => m.name)).toEqual(['a'])
    expect(joinableMembers(federation, 0).map((m) => m.name)).toEqual(['a', 'b'])
    const plan = checkJobPlan(form(), federation, 10)
    expect(plan.ok).toBe(false)
  })

  it("blocks a target ε above this node's dataset budget", () => {
    const plan = checkJobPlan(form({ dp: { mode: 'sgd', target_epsilon: 5 } }), threeNodes, 2)
    expect(plan.problems[0]).toMatchObject({ field: 'dp.target_epsilon' })
  })

  it('does not block when the node cannot say who can join', () => {
    expect(checkJobPlan(form({ committee_size: 5 }), null, null).ok).toBe(true)
  })

  it('suggests numbers that fit: one committee member, everyone else trains', () => {
    expect(fittingDefaults(threeNodes, 3)).toEqual({ committee_size: 1, min_trainers: 2, top_k: 2 })
    expect(fittingDefaults({ members: [member('a', 10)] }, 3)).toBeNull()
  })
})
