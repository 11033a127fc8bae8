import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import JobContributions from '../src/components/jobs/JobContributions.vue'
import { settle } from './helpers.js'

const contributions = [
  { node: '0xaaaa000000000000000000000000000000000001', accepted_updates: 0, accepted_median_sum: 0, updates: 0, reveals: 2, votes: 1, share: 0.25 },
  { node: '0xbbbb000000000000000000000000000000000002', accepted_updates: 2, accepted_median_sum: 17000, updates: 2, reveals: 0, votes: 1, share: 0.75 },
  { node: '0xcccc000000000000000000000000000000000003', accepted_updates: 0, accepted_median_sum: 0, updates: 2, reveals: 0, votes: 0, share: 0 },
]

describe('JobContributions', () => {
  it('lists the largest share first with accepted updates, mean median and committee work', async () => {
    const wrapper = mount(JobContributions, { props: { contributions }, attachTo: document.body })
    await settle()
    const rows = wrapper.findAll('.el-table__body tr')
    expect(rows).toHaveLength(3)
    expect(rows[0].find('[data-test=share]').text()).toBe('75.0%')
    expect(rows[0].find('[data-test=accepted]').text()).toBe('2 of 2')
    expect(rows[0].text()).toContain('85.0%')
    expect(rows[1].text()).toContain('2 reveals · 1 votes')
    expect(rows[2].find('[data-test=share]').text()).toBe('0.0%')
    expect(rows[2].text()).toContain('—')
    wrapper.unmount()
  })
})
