import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import RoundEncodingsTable from '../src/components/jobs/RoundEncodingsTable.vue'
import { settle } from './helpers.js'

const encodings = {
  'head.bias': { dense: 2, delta: 0, density: 1, bytes: 32, dense_bytes: 32 },
  'embedding.weight': { dense: 0, delta: 2, density: 0.05, bytes: 144000, dense_bytes: 2560000 },
  'head.weight': { dense: 1, delta: 1, density: 0.5, bytes: 300, dense_bytes: 512 },
}

describe('RoundEncodingsTable', () => {
  it('lists the largest tensor first with its encodings, density and share of the dense bytes', async () => {
    const wrapper = mount(RoundEncodingsTable, { props: { encodings }, attachTo: document.body })
    await settle()
    const rows = wrapper.findAll('.el-table__body tr')
    expect(rows).toHaveLength(3)
    expect(rows[0].text()).toContain('embedding.weight')
    expect(rows[0].find('[data-test=encoding-delta]').text()).toBe('delta ×2')
    expect(rows[0].find('[data-test=encoding-dense]').exists()).toBe(false)
    expect(rows[0].text()).toContain('5.0%')
    expect(rows[0].find('[data-test=encoding-share]').text()).toContain('5.6% of dense')
    // A tensor some trainers sent dense and others as delta shows both.
    expect(rows[1].find('[data-test=encoding-delta]').exists()).toBe(true)
    expect(rows[1].find('[data-test=encoding-dense]').text()).toBe('dense ×1')
    wrapper.unmount()
  })

  it('says so when no update of the round was decoded here', async () => {
    const wrapper = mount(RoundEncodingsTable, { props: { encodings: {} } })
    await settle()
    expect(wrapper.find('[data-test=round-encodings-empty]').exists()).toBe(true)
    wrapper.unmount()
  })
})
