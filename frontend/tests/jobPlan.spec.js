import { describe, it, expect } from 'vitest'
import { DEFAULT_COMMITTEE, checkJobPlan, fittingDefaults, formatDelta, joinableMembers, parseDelta, suggestedDelta } from '../src/lib/jobPlan.js'

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
    expect(plan.problems[0].message).toContain('At most 1 minimum trainers')
  })

  it('counts only members with a dataset of the chosen dataset\'s schema', () => {
    const withSchema = (name, schema) => ({ address: `0x${name}`, name, datasets: [{ id: 1, schema_hash: `0x${schema}`, epsilon_left: 10 }] })
    const federation = { members: [withSchema('a', 'aa'), withSchema('b', 'bb'), withSchema('c', 'AA')] }
    expect(joinableMembers(federation, 3, 'aa').map((m) => m.name)).toEqual(['a', 'c'])
    expect(joinableMembers(federation, 3).map((m) => m.name)).toEqual(['a', 'b', 'c'])
  })

  it('refuses a δ above 1/(10·n) of the chosen dataset, beside δ', () => {
    const dataset = { name: 'census', num_samples: 200_000, schema_hash: null }
    const plan = checkJobPlan(form({ dp: { mode: 'sgd', target_epsilon: 3, delta: 1e-5 } }), threeNodes, 10, dataset)
    expect(plan.problems[0]).toMatchObject({ field: 'dp.delta' })
    expect(plan.problems[0].message).toContain('5e-7')
  })

  it('writes and reads δ in scientific notation', () => {
    expect(formatDelta(1e-7)).toBe('1e-7')
    expect(formatDelta(1.25e-5)).toBe('1.25e-5')
    expect(parseDelta('1e-7')).toBe(1e-7)
    expect(parseDelta(' 0.00001 ')).toBe(1e-5)
    expect(parseDelta('1E-6')).toBe(1e-6)
    expect(Number.isNaN(parseDelta('ten'))).toBe(true)
    expect(suggestedDelta(600)).toBe(1e-5)
    expect(suggestedDelta(150_000)).toBe(5e-7)
    expect(suggestedDelta(2_000_000)).toBe(5e-8)
  })

  it('refuses an even or small committee where the deployment says it is production', () => {
    const production = { ...threeNodes, allow_small_committees: false }
    expect(checkJobPlan(form({ committee_size: 1, min_trainers: 2 }), production, 10).problems[0]).toMatchObject({ field: 'committee_size' })
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

  it('suggests numbers that fit: a committee of 3 (the production minimum), everyone else trains', () => {
    const five = { members: ['a', 'b', 'c', 'd', 'e'].map((name) => member(name, 10)) }
    expect(DEFAULT_COMMITTEE).toBe(3)
    expect(fittingDefaults(five, 3)).toEqual({ committee_size: 3, min_trainers: 2, top_k: 2 })
    expect(fittingDefaults({ members: [...five.members, member('f', 1)] }, 3)).toEqual({ committee_size: 3, min_trainers: 2, top_k: 2 })
    // three members cannot seat a committee of 3 and still train: no suggestion, the plan says why
    expect(fittingDefaults(threeNodes, 3)).toBeNull()
    expect(checkJobPlan(form({ committee_size: 3 }), threeNodes, 10).problems.map((p) => p.field)).toEqual(['committee_size'])
    // a development deployment (the demo's three nodes): a committee of 1 and two trainers
    expect(fittingDefaults({ ...threeNodes, allow_small_committees: true }, 3)).toEqual({ committee_size: 1, min_trainers: 2, top_k: 2 })
  })
})
