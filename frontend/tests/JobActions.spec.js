import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import JobActions from '../src/components/jobs/JobActions.vue'
import { isActiveJob } from '../src/lib/jobOptions.js'

const ME = '0xA11ce00000000000000000000000000000000001'
const OTHER = '0xb0b0000000000000000000000000000000000002'
const job = (over = {}) => ({ id: 4, name: 'j', status: 'open', proposer: ME, committee_size: 1, min_trainers: 2, participants: [{ node: ME }], joined: { dataset: 1 }, ...over })
const has = (wrapper, test) => wrapper.find(`[data-test=${test}]`).exists()

describe('job actions', () => {
  it('offers Start only to the proposer and only once enough participants joined', () => {
    let wrapper = mount(JobActions, { props: { job: job(), me: ME.toLowerCase() } })
    expect(has(wrapper, 'start-job')).toBe(false)
    expect(wrapper.find('[data-test=start-waiting]').text()).toContain('1 of 3 participants joined')
    wrapper = mount(JobActions, { props: { job: job({ participants: [{ node: ME }, { node: OTHER }, { node: '0x3' }] }), me: ME } })
    expect(has(wrapper, 'start-job')).toBe(true)
    expect(has(wrapper, 'cancel-job')).toBe(true)
  })

  it('offers neither Start nor Cancel to a node that did not propose the job', () => {
    const wrapper = mount(JobActions, { props: { job: job({ participants: [{}, {}, {}] }), me: OTHER } })
    expect(has(wrapper, 'start-job')).toBe(false)
    expect(has(wrapper, 'cancel-job')).toBe(false)
    expect(has(wrapper, 'start-waiting')).toBe(false)
  })

  it('offers Join with this node\'s on-chain datasets while the job is open and not joined', () => {
    const datasets = [
      { id: 1, name: 'on-chain', onchain_id: '5', status: 'stored' },
      { id: 2, name: 'local-only', onchain_id: '', status: 'stored' },
    ]
    const wrapper = mount(JobActions, { props: { job: job({ joined: null, proposer: OTHER }), me: ME, datasets } })
    expect(has(wrapper, 'join-form')).toBe(true)
    expect(mount(JobActions, { props: { job: job({ status: 'running', joined: null }), me: ME } }).find('[data-test=join-form]').exists()).toBe(false)
  })

  it('keeps Start and Cancel hidden while this node\'s address is unknown', () => {
    const wrapper = mount(JobActions, { props: { job: job({ participants: [{}, {}, {}] }), me: null } })
    expect(has(wrapper, 'start-job') || has(wrapper, 'cancel-job')).toBe(false)
  })

  it('keeps a drawing job live and cancellable: started, its committee not drawn yet', () => {
    expect(isActiveJob({ status: 'drawing' })).toBe(true)
    const wrapper = mount(JobActions, { props: { job: job({ status: 'drawing' }), me: ME } })
    expect(has(wrapper, 'cancel-job')).toBe(true)
    expect(has(wrapper, 'start-job') || has(wrapper, 'join-form')).toBe(false)
  })
})
