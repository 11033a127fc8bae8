import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, api: { createJob: vi.fn(), joinJob: vi.fn(), jobLimits: vi.fn() } }
})

import JobForm from '../src/components/jobs/JobForm.vue'
import { api } from '../src/lib/api.js'

// As GET /api/jobs/limits answers (backend/limits.py); odd numbers, so no literal in the form can match.
const LIMITS = { max_rounds: 9999, max_local_epochs: 999, max_batch_size: 4097, max_committee: 7, max_top_k: 127, max_participants: 50, max_period_s: 7777, max_join_timeout_s: 8888, max_target_epsilon: 42 }

const SCHEMA = 'ab'.repeat(32)
const member = (name, self = false) => ({ address: `0x${name}`, name, self, datasets: [{ id: 1, schema_hash: `0x${SCHEMA}`, epsilon_left: 9 }] })
const datasets = [{ id: 5, name: 'clinic', num_samples: 600, status: 'stored', onchain_id: '4', schema_hash: SCHEMA, budget: { epsilon_left: 9 } }]

async function fillAndSubmit(candidates) {
  const wrapper = mount(JobForm, { props: { datasets, candidates }, attachTo: document.body })
  await settle()
  await wrapper.find('input[data-test=job-name]').setValue('mnist')
  wrapper.vm.form.dataset = 5
  await settle()
  await wrapper.find('form').trigger('submit')
  await settle()
  return wrapper
}

describe('job wizard', { timeout: 30000 }, () => {
  beforeEach(() => {
    api.createJob.mockReset()
    api.joinJob.mockReset()
    api.jobLimits.mockReset()
    api.jobLimits.mockResolvedValue(LIMITS)
  })

  it('fits committee and trainers to the members that can join, creates the job and joins it with the chosen dataset', async () => {
    api.createJob.mockResolvedValue({ id: 9, name: 'mnist' })
    api.joinJob.mockResolvedValue({ id: 9, name: 'mnist', joined: { dataset: 5 } })
    const wrapper = await fillAndSubmit({ address: '0xa', members: [member('a', true), member('b'), member('c'), member('d'), member('e')] })
    expect(api.createJob).toHaveBeenCalledTimes(1)
    expect(api.createJob.mock.calls[0][0]).toMatchObject({ committee_size: 3, min_trainers: 2, top_k: 2, dataset: 5, defense: 'levelled' })
    expect(api.joinJob).toHaveBeenCalledWith(9, 5)
    expect(wrapper.emitted('created')[0]).toEqual([{ id: 9, name: 'mnist', joined: { dataset: 5 } }, ''])
    wrapper.unmount()
  })

  it('defaults to a committee of 3 and sends nothing while three members cannot seat it and train', async () => {
    const wrapper = await fillAndSubmit({ address: '0xa', allow_small_committees: false, members: [member('a', true), member('b'), member('c')] })
    expect(wrapper.vm.form.committee_size).toBe(3)
    expect(api.createJob).not.toHaveBeenCalled()
    expect(wrapper.find('[data-test=job-plan-problems]').text()).toContain('A committee of 3 leaves no trainer')
    expect(wrapper.find('[data-test=committee-rule]').text()).toContain('at least 3')
    wrapper.unmount()
  })

  it('starts on the three-node development federation with its defaults: a committee of 1 and 2 trainers', async () => {
    api.createJob.mockResolvedValue({ id: 9, name: 'mnist' })
    api.joinJob.mockResolvedValue({ id: 9, name: 'mnist' })
    const wrapper = await fillAndSubmit({ address: '0xa', allow_small_committees: true, members: [member('a', true), member('b'), member('c')] })
    expect(api.createJob.mock.calls[0][0]).toMatchObject({ committee_size: 1, min_trainers: 2, top_k: 2 })
    wrapper.unmount()
  })

  it('takes δ in scientific notation, follows the dataset\'s 1/(10·n) and says it beside δ', async () => {
    const big = { ...datasets[0], id: 6, name: 'census', num_samples: 2_000_000 }
    const wrapper = mount(JobForm, { props: { datasets: [big], candidates: null }, attachTo: document.body })
    await settle()
    wrapper.vm.form.dataset = 6
    await settle()
    // 1/(10·2e6) = 5e-8: the suggestion follows the dataset, never 0.000000
    expect(wrapper.find('input[data-test=job-delta]').element.value).toBe('5e-8')
    expect(wrapper.find('[data-test=delta-rule]').text()).toContain('5e-8')
    await wrapper.find('input[data-test=job-name]').setValue('census')
    await wrapper.find('input[data-test=job-delta]').setValue('1e-6')
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.createJob).not.toHaveBeenCalled()
    expect(wrapper.text()).toContain('δ must be at most 1/(10·n) = 5e-8')
    await wrapper.find('input[data-test=job-delta]').setValue('1e-8')
    api.createJob.mockResolvedValue({ id: 3, name: 'census' })
    api.joinJob.mockResolvedValue({ id: 3, name: 'census' })
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.createJob.mock.calls[0][0].dp.delta).toBe(1e-8)
    wrapper.unmount()
  })

  it('sends the default (levelled) defense, and a job without one only once it is chosen explicitly', async () => {
    api.createJob.mockResolvedValue({ id: 9, name: 'mnist' })
    api.joinJob.mockResolvedValue({ id: 9, name: 'mnist' })
    const candidates = { address: '0xa', allow_small_committees: true, members: [member('a', true), member('b'), member('c')] }
    const wrapper = mount(JobForm, { props: { datasets, candidates }, attachTo: document.body })
    await settle()
    await wrapper.find('input[data-test=job-name]').setValue('mnist')
    Object.assign(wrapper.vm.form, { dataset: 5, defense: 'none' })
    await settle()
    expect(wrapper.find('[data-test=undefended-warning]').exists()).toBe(true)
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.createJob).not.toHaveBeenCalled()
    expect(wrapper.find('[data-test=job-plan-problems]').text()).toContain('runs undefended')
    await wrapper.find('[data-test=undefended-confirm] input').setValue(true)
    await settle()
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.createJob.mock.calls[0][0]).toMatchObject({ defense: 'none' })
    wrapper.unmount()
  })

  it('shows the node\'s 409 beside the field it names', async () => {
    api.createJob.mockRejectedValue({ status: 409, detail: 'the job\'s delta is too large', errors: { 'dp.delta': ['the job\'s delta 1e-05 is too large for dataset clinic'] } })
    const wrapper = await fillAndSubmit(null)
    const items = wrapper.findAll('.el-form-item').filter((item) => item.text().includes('too large for dataset clinic'))
    expect(items).toHaveLength(1)
    expect(items[0].find('[data-test=job-delta]').exists()).toBe(true)
    wrapper.unmount()
  })

  it('shows the API\'s refusal of a small committee next to the field', async () => {
    api.createJob.mockRejectedValue({ detail: 'invalid input', errors: { committee_size: ['committee size must be odd and at least 3'] } })
    const wrapper = mount(JobForm, { props: { datasets, candidates: null }, attachTo: document.body })
    await settle()
    await wrapper.find('input[data-test=job-name]').setValue('mnist')
    Object.assign(wrapper.vm.form, { dataset: 5, committee_size: 1 })
    await settle()
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.createJob.mock.calls[0][0]).toMatchObject({ committee_size: 1 })
    expect(wrapper.text()).toContain('committee size must be odd and at least 3')
    wrapper.unmount()
  })

  it('sends nothing when the federation cannot start the job, and says why', async () => {
    const wrapper = await fillAndSubmit({ address: '0xa', members: [member('a', true)] })
    expect(api.createJob).not.toHaveBeenCalled()
    expect(wrapper.find('[data-test=job-plan-problems]').text()).toContain('leaves no trainer among the 1 member(s) that can join')
    expect(wrapper.find('[data-test=job-submit]').attributes('disabled')).toBeDefined()
    wrapper.unmount()
  })

  it('bounds its fields by the node\'s limits, not by literals of its own', async () => {
    const wrapper = mount(JobForm, { props: { datasets, candidates: null }, attachTo: document.body })
    await settle()
    expect(api.jobLimits).toHaveBeenCalledTimes(1)
    const maxOf = (label) => wrapper.find(`input[aria-label="${label}"]`).attributes('max')
    expect(maxOf('Rounds')).toBe('9999')
    expect(maxOf('Local epochs')).toBe('999')
    expect(maxOf('Batch size')).toBe('4097')
    expect(maxOf('Committee size')).toBe('7')
    expect(maxOf('Top k')).toBe('127')
    expect(maxOf('Minimum trainers')).toBe(String(50 - wrapper.vm.form.committee_size))
    expect(maxOf('Round deadline in seconds')).toBe('7777')
    expect(maxOf('Join deadline in seconds')).toBe('8888')
    expect(maxOf('Target epsilon')).toBe('42')
    wrapper.unmount()
  })

  it('leaves the bounds to the API when the limits cannot be read', async () => {
    api.jobLimits.mockRejectedValue({ status: 0, detail: 'The node cannot be reached.' })
    const wrapper = mount(JobForm, { props: { datasets, candidates: null }, attachTo: document.body })
    await settle()
    expect(wrapper.find('input[aria-label="Committee size"]').attributes('max')).toBe('Infinity')
    wrapper.unmount()
  })
})
