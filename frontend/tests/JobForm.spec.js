import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, api: { createJob: vi.fn(), joinJob: vi.fn() } }
})

import JobForm from '../src/components/jobs/JobForm.vue'
import { api } from '../src/lib/api.js'

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
  })

  it('fits committee and trainers to the members that can join, creates the job and joins it with the chosen dataset', async () => {
    api.createJob.mockResolvedValue({ id: 9, name: 'mnist' })
    api.joinJob.mockResolvedValue({ id: 9, name: 'mnist', joined: { dataset: 5 } })
    const wrapper = await fillAndSubmit({ address: '0xa', members: [member('a', true), member('b'), member('c')] })
    expect(api.createJob).toHaveBeenCalledTimes(1)
    expect(api.createJob.mock.calls[0][0]).toMatchObject({ committee_size: 1, min_trainers: 2, top_k: 2, dataset: 5 })
    expect(api.joinJob).toHaveBeenCalledWith(9, 5)
    expect(wrapper.emitted('created')[0]).toEqual([{ id: 9, name: 'mnist', joined: { dataset: 5 } }, ''])
    wrapper.unmount()
  })

  it('sends nothing when the federation cannot start the job, and says why', async () => {
    const wrapper = await fillAndSubmit({ address: '0xa', members: [member('a', true)] })
    expect(api.createJob).not.toHaveBeenCalled()
    expect(wrapper.find('[data-test=job-plan-problems]').text()).toContain('only 1 member(s) can join')
    expect(wrapper.find('[data-test=job-submit]').attributes('disabled')).toBeDefined()
    wrapper.unmount()
  })
})
