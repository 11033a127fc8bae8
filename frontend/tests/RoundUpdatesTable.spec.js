import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import RoundUpdatesTable from '../src/components/jobs/RoundUpdatesTable.vue'
import RoundDetail from '../src/components/jobs/RoundDetail.vue'
import { settle } from './helpers.js'

const A = '0xaaaa000000000000000000000000000000000001'
const B = '0xbbbb000000000000000000000000000000000002'
const names = { [A]: 'org-a', [B]: 'org-b', '0x1111111111111111111111111111111111111111': 'org-c' }
const updates = [
  { trainer: '0x1111111111111111111111111111111111111111', index: 0, samples: 600, scores: { [A]: 8120, [B]: 8060 }, median: 8090, accepted: true, decision: { state: 'accepted', reason: "its median 80.9% beat the base model's 76.4%; ranked 1 of the top 2", threshold: 7640 }, tx_hash: '0xfeed000000000000000000000000000000000000000000000000000000000001', block: 41, content_hash: '0xc0ffee01' },
  { trainer: '0x2222222222222222222222222222222222222222', index: 1, samples: 580, scores: { [A]: 950, [B]: 1010 }, median: 980, accepted: false, decision: { state: 'rejected', reason: "its median 9.8% did not beat the base model's 76.4% (it needed more than 76.4%)", threshold: 7640 }, tx_hash: '0xfeed000000000000000000000000000000000000000000000000000000000002', block: 42, content_hash: '0xc0ffee02' },
  { trainer: '0x3333333333333333333333333333333333333333', index: 2, samples: 610, scores: {}, median: null, accepted: null, decision: { state: 'pending', reason: "waiting for the committee's scores", threshold: null }, tx_hash: '0xfeed03', block: 43 },
]

describe('RoundUpdatesTable', () => {
  it('gives each update its decision and the reason, a rejected row highlighted', async () => {
    const wrapper = mount(RoundUpdatesTable, { props: { updates, names }, attachTo: document.body })
    await settle()
    const rows = wrapper.findAll('tbody tr')
    expect(rows).toHaveLength(3)
    expect(rows[0].find('[data-test=update-accepted]').exists()).toBe(true)
    expect(rows[1].find('[data-test=update-rejected]').text()).toBe('rejected')
    expect(rows[1].find('[data-test=update-reason]').text()).toContain("did not beat the base model's 76.4%")
    expect(rows[2].find('[data-test=update-pending]').exists()).toBe(true)
    expect(rows[1].classes()).toContain('rejected-row')
    expect(rows[0].classes()).not.toContain('rejected-row')
    wrapper.unmount()
  })

  it('shows scores in percent by member name (the address on hover), the median, the transaction and the block', async () => {
    const wrapper = mount(RoundUpdatesTable, { props: { updates, names }, attachTo: document.body })
    await settle()
    const rejected = wrapper.findAll('tbody tr')[1]
    expect(rejected.text()).toContain('org-a: 9.5%')
    expect(rejected.text()).toContain('org-b: 10.1%')
    expect(rejected.find('[data-test=update-median]').text()).toBe('9.8%')
    expect(rejected.text()).toContain('42')
    expect(rejected.find(`[title="${A}"]`).exists()).toBe(true)
    expect(rejected.find('[title="0xfeed000000000000000000000000000000000000000000000000000000000002"]').exists()).toBe(true)
    expect(wrapper.findAll('tbody tr')[0].text()).toContain('org-c')
    expect(wrapper.findAll('tbody tr')[2].text()).toContain('not scored yet')
    wrapper.unmount()
  })
})

describe('RoundDetail', () => {
  it('states the base score, the margin and the threshold, and each transaction\'s gas', async () => {
    const round = {
      round: 2, phase: 'aggregating', committee: [A, B], base_median: 7640, margin: 50, top_k: 2, gas: 310000,
      base_scores: { [A]: 7700, [B]: 7640 }, updates, update_deadline: Math.floor(Date.now() / 1000) + 180, score_deadline: null,
      transactions: [{ name: 'ScoresSubmitted', actor: B, gas: 110000, tx_hash: '0xabc', block: 9 }, { name: 'RoundFinalized', actor: '', gas: null, tx_hash: '0xdef', block: 10 }],
      privacy: [], encodings: {},
    }
    const wrapper = mount(RoundDetail, { props: { round, names }, attachTo: document.body })
    await settle()
    expect(wrapper.find('[data-test=base-median]').text()).toBe('76.4%')
    expect(wrapper.find('[data-test=threshold]').text()).toBe('76.9%')
    expect(wrapper.find('[data-test=round-rule]').text()).toContain('org-a scored the base 77.0%')
    expect(wrapper.text()).toContain('(in 3 minutes)')
    expect(wrapper.find('[data-test=round-gas]').text()).toContain('310,000 gas')
    const gas = wrapper.findAll('[data-test=tx-gas]').map((cell) => cell.text())
    expect(gas).toEqual(['110,000', '…'])
    expect(wrapper.find('[data-test=round-transactions]').text()).toContain('org-b')
    wrapper.unmount()
  })
})
