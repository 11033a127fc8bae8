import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, api: { node: vi.fn(), peers: vi.fn() } }
})

import HealthBanner from '../src/components/common/HealthBanner.vue'
import { clearSession, setSession } from '../src/lib/session.js'
import { api, ApiError } from '../src/lib/api.js'

const healthy = { chain: { available: true } }

describe('HealthBanner', () => {
  beforeEach(() => {
    vi.clearAllMocks()
    setSession('token', { username: 'op', role: 'operator' })
    api.node.mockResolvedValue(healthy)
    api.peers.mockResolvedValue([{ name: 'org-b', address: '0xb', healthy: true }])
  })

  it('stays hidden while the node, its chain and its peers are fine', async () => {
    const wrapper = mount(HealthBanner, { props: { intervalMs: 20 } })
    await settle()
    expect(wrapper.find('[data-test=health-banner]').exists()).toBe(false)
    wrapper.unmount()
  })

  it('asks nothing while signed out (the sign-in redirect is under way)', async () => {
    clearSession()
    const wrapper = mount(HealthBanner, { props: { intervalMs: 20 } })
    await settle()
    expect(api.node).not.toHaveBeenCalled()
    wrapper.unmount()
  })

  it('names what is down and clears by itself when it comes back', async () => {
    api.node.mockRejectedValue(new ApiError(0, 'The node cannot be reached.'))
    const wrapper = mount(HealthBanner, { props: { intervalMs: 20 } })
    await settle()
    expect(wrapper.find('[data-test=health-banner]').text()).toContain('This node is not answering')

    api.node.mockResolvedValue({ chain: { available: false } })
    api.peers.mockResolvedValue([{ name: 'org-b', address: '0xb', healthy: false }])
    await settle(100)
    const text = wrapper.find('[data-test=health-banner]').text()
    expect(text).toContain('The chain is unreachable')
    expect(text).toContain('Peer down: org-b')

    api.node.mockResolvedValue(healthy)
    api.peers.mockResolvedValue([{ name: 'org-b', address: '0xb', healthy: true }])
    await settle(100)
    expect(wrapper.find('[data-test=health-banner]').exists()).toBe(false)
    wrapper.unmount()
  })
})
