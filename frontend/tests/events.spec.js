import { describe, it, expect } from 'vitest'
import { describeArgs, formatArg } from '../src/lib/events.js'
import { effectivePhase } from '../src/lib/rounds.js'

describe('chain events in human units', () => {
  it('shows micro-ε as ε, basis points as percent, and hides key material', () => {
    expect(formatArg('amount', 1250000)).toBe('ε 1.250')
    expect(formatArg('scores', [8123, 9000])).toBe('81.2% 90.0%')
    const text = describeArgs({ datasetId: 1, grantee: '0x' + 'ab'.repeat(20), wrappedKey: '0xdeadbeef' })
    expect(text).toContain('datasetId 1')
    expect(text).not.toContain('wrappedKey')
    expect(text).toContain('0xabab…abab')
  })

  it('shows a base score as a percentage, a deadline as a local date and a node by its name', () => {
    expect(formatArg('baseScore', 7364)).toBe('73.6%')
    expect(formatArg('medians', [7670, 7210])).toBe('76.7% 72.1%')
    const deadline = Math.floor(Date.now() / 1000) + 180
    expect(formatArg('updateDeadline', deadline)).toContain('(in 3 minutes)')
    expect(formatArg('updateDeadline', deadline)).not.toContain(String(deadline))
    const address = '0x' + 'cd'.repeat(20)
    expect(describeArgs({ trainer: address }, { [address]: 'org-b' })).toBe('trainer org-b')
  })
})

describe('round phase', () => {
  const round = (updates) => ({ phase: 'training', updates })
  it('is scoring once every expected update is in, or a score arrived', () => {
    expect(effectivePhase(round([{}, {}]), 3)).toBe('training')
    expect(effectivePhase(round([{}, {}, {}]), 3)).toBe('scoring')
    expect(effectivePhase(round([{ scores: { m: 9000 } }]), 3)).toBe('scoring')
  })
})
