import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import RoundUpdatesTable from '../src/components/jobs/RoundUpdatesTable.vue'
import { settle } from './helpers.js'

const updates = [
  { trainer: '0x1111111111111111111111111111111111111111', samples: 600, scores: { '0xaaaa000000000000000000000000000000000001': 8120, '0xbbbb000000000000000000000000000000000002': 8060 }, median: 8090, accepted: true, tx_hash: '0xfeed000000000000000000000000000000000000000000000000000000000001', block: 41, content_hash: '0xc0ffee01' },
  { trainer: '0x2222222222222222222222222222222222222222', samples: 580, scores: { '0xaaaa000000000000000000000000000000000001': 950, '0xbbbb000000000000000000000000000000000002': 1010 }, median: 980, accepted: false, tx_hash: '0xfeed000000000000000000000000000000000000000000000000000000000002', block: 42, content_hash: '0xc0ffee02' },
  { trainer: '0x3333333333333333333333333333333333333333', samples: 610, scores: {}, median: null, accepted: null, tx_hash: '0xfeed03', block: 43 },
]

describe('RoundUpdatesTable', () => {
  it('marks accepted and rejected updates and shows pending ones as pending', async () => {
    const wrapper = mount(RoundUpdatesTable, { props: { updates }, attachTo: document.body })
    await settle()
    const rows = wrapper.findAll('.el-table__body tr')
    expect(rows).toHaveLength(3)
    expect(rows[0].find('[data-test=update-accepted]').exists()).toBe(true)
    expect(rows[1].find('[data-test=update-rejected]').text()).toBe('rejected')
    expect(rows[2].find('[data-test=update-pending]').exists()).toBe(true)
    // A rejected update is highlighted as a whole row.
    expect(rows[1].classes()).toContain('rejected-row')
    expect(rows[0].classes()).not.toContain('rejected-row')
    wrapper.unmount()
  })

  it('shows committee scores in percent, the median, the transaction and the block', async () => {
    const wrapper = mount(RoundUpdatesTable, { props: { updates }, attachTo: document.body })
    await settle()
    const rejected = wrapper.findAll('.el-table__body tr')[1]
    expect(rejected.text()).toContain('9.5%')
    expect(rejected.text()).toContain('10.1%')
    expect(rejected.text()).toContain('9.8%')
    expect(rejected.text()).toContain('42')
    expect(rejected.find('[title="0xfeed000000000000000000000000000000000000000000000000000000000002"]').exists()).toBe(true)
    expect(wrapper.findAll('.el-table__body tr')[2].text()).toContain('not scored yet')
    wrapper.unmount()
  })
})
