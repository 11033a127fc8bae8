import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { createRouter, createMemoryHistory } from 'vue-router'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  const me = '0xa11ce00000000000000000000000000000000001'
  const job = { id: 3, name: 'mnist', status: 'running', rounds: 5, current_round: 1, model: 'mlp', strategy: 'fedavg', proposer: me }
  return {
    ...actual,
    api: {
      datasets: vi.fn(async () => [{ id: 1, name: 'clinic', format: 'csv', status: 'stored', budget: { epsilon_cap: 3, epsilon_spent: 0 } }]),
      jobs: vi.fn(async () => [job]),
      job: vi.fn(async () => job),
      rounds: vi.fn(async () => []),
      grantedDatasets: vi.fn(async () => []),
      joinCandidates: vi.fn(async () => ({ address: me, members: [] })),
    },
  }
})

import { can } from '../src/lib/permissions.js'
import { guard, routes } from '../src/router.js'
import { setSession, clearSession } from '../src/lib/session.js'
import DatasetsPage from '../src/pages/DatasetsPage.vue'
import JobsPage from '../src/pages/JobsPage.vue'
import JobPage from '../src/pages/JobPage.vue'

const signInAs = (role) => setSession('token', { username: role, role })

async function mountPage(component, props = {}) {
  const router = createRouter({ history: createMemoryHistory(), routes })
  router.push('/')
  await router.isReady()
  const wrapper = mount(component, { props, global: { plugins: [router] }, attachTo: document.body })
  await settle()
  return wrapper
}

describe('role gating', () => {
  beforeEach(() => clearSession())

  it('follows the API: operators everything, providers datasets, viewers read only', () => {
    expect(can('operator', 'jobs:write')).toBe(true)
    expect(can('operator', 'datasets:write')).toBe(true)
    expect(can('provider', 'datasets:write')).toBe(true)
    expect(can('provider', 'grants:write')).toBe(true)
    expect(can('provider', 'jobs:write')).toBe(false)
    expect(can('viewer', 'datasets:write')).toBe(false)
    expect(can('viewer', 'grants:write')).toBe(false)
    expect(can('viewer', 'jobs:write')).toBe(false)
    expect(can(undefined, 'jobs:write')).toBe(false)
  })

  it('sends signed-out users to sign in, and non-operators away from job creation', () => {
    const route = (path) => {
      const found = routes.find((candidate) => candidate.path === path)
      return { fullPath: path, meta: found.meta }
    }
    expect(guard(route('/datasets'))).toEqual({ name: 'login', query: { redirect: '/datasets' } })
    expect(guard(route('/login'))).toBe(true)
    signInAs('provider')
    expect(guard(route('/jobs/new'))).toEqual({ name: 'overview' })
    expect(guard(route('/datasets'))).toBe(true)
    signInAs('operator')
    expect(guard(route('/jobs/new'))).toBe(true)
  })

  it('offers dataset upload to providers and operators, not to viewers', async () => {
    signInAs('viewer')
    let page = await mountPage(DatasetsPage)
    expect(page.find('[data-test=upload-form]').exists()).toBe(false)
    expect(page.find('[data-test=upload-not-allowed]').exists()).toBe(true)
    expect(page.find('[data-test=datasets-table]').text()).toContain('clinic')
    page.unmount()

    for (const role of ['provider', 'operator']) {
      signInAs(role)
      page = await mountPage(DatasetsPage)
      expect(page.find('[data-test=upload-form]').exists()).toBe(true)
      expect(page.find('[data-test=upload-not-allowed]').exists()).toBe(false)
      page.unmount()
    }
  })

  it('offers job creation only to operators', async () => {
    for (const [role, offered] of [
      ['operator', true],
      ['provider', false],
      ['viewer', false],
    ]) {
      signInAs(role)
      const page = await mountPage(JobsPage)
      expect(page.find('[data-test=new-job]').exists()).toBe(offered)
      expect(page.find('[data-test=jobs-table]').text()).toContain('mnist')
      page.unmount()
    }
  })

  it('offers cancelling a running job only to operators of the proposing node', async () => {
    for (const [role, offered] of [
      ['operator', true],
      ['provider', false],
      ['viewer', false],
    ]) {
      signInAs(role)
      const page = await mountPage(JobPage, { id: '3' })
      expect(page.find('[data-test=job-summary]').exists()).toBe(true)
      expect(page.find('[data-test=cancel-job]').exists()).toBe(offered)
      page.unmount()
    }
  })
})
