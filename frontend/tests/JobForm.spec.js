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

const member = (name, self = false) => ({ address: `0x${name}`, name, self, datasets: [{ id: 1, epsilon_left: 9 }] })
const datasets = [{ id: 5, name: 'clinic', num_samples: 600, status: 'stored', budget: { epsilon_left: 9 } }]

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
    expect(api.createJob.mock.calls[0][0]).toMatchObject({ committee_size: 3, min_trainers: 2, top_k: 2, dataset: 5 })
    expect(api.joinJob).toHaveBeenCalledWith(9, 5)
    expect(wrapper.emitted('created')[0]).toEqual([{ id: 9, name: 'mnist', joined: { dataset: 5 } }, ''])
    wrapper.unmount()
  })

  it('defaults to a committee of 3 and sends nothing while three members cannot seat it and train', async () => {
    const wrapper = await fillAndSubmit({ address: '0xa', members: [member('a', true), member('b'), member('c')] })
    expect(wrapper.vm.form.committee_size).toBe(3)
    expect(api.createJob).not.toHaveBeenCalled()
    expect(wrapper.find('[data-test=job-plan-problems]').text()).toContain('A committee of 3 leaves no trainer')
    expect(wrapper.find('[data-test=committee-rule]').text()).toContain('at least 3')
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
    expect(wrapper.find('[data-test=job-plan-problems]').text()).toContain('only 1 member(s) can join')
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
