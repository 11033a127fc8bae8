import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { createRouter, createMemoryHistory } from 'vue-router'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return {
    ...actual,
    api: {
      users: vi.fn(),
      tokens: vi.fn(),
      updateUser: vi.fn(),
      createUser: vi.fn(),
      createToken: vi.fn(),
      revokeToken: vi.fn(),
    },
  }
})

import { api } from '../src/lib/api.js'
import { guard, routes } from '../src/router.js'
import { session, setSession } from '../src/lib/session.js'
import { fromNow } from '../src/lib/format.js'
import AccountPage from '../src/pages/AccountPage.vue'
import UsersPage from '../src/pages/UsersPage.vue'

const soon = new Date(Date.now() + 3 * 3600 * 1000).toISOString()
const token = (id, kind, name, extra = {}) => ({ id, kind, name, user: 'ada', prefix: 'abcd1234', created: soon, expires: soon, last_used: null, current: false, ...extra })

async function mountPage(component) {
  const router = createRouter({ history: createMemoryHistory(), routes })
  router.push('/')
  await router.isReady()
  const wrapper = mount(component, { global: { plugins: [router] }, attachTo: document.body })
  await settle()
  return { wrapper, router }
}

describe('accounts', () => {
  beforeEach(() => {
    for (const fn of Object.values(api)) fn.mockReset()
  })

  it('lists this user\'s logins apart from its script tokens and signs another device out without touching this one', async () => {
    setSession('mine', { username: 'ada', role: 'viewer' })
    api.tokens.mockResolvedValue([token(1, 'login', 'Chrome on Linux', { current: true }), token(2, 'login', 'phone'), token(3, 'script', 'nightly export')])
    api.revokeToken.mockResolvedValue(undefined)
    const { wrapper } = await mountPage(AccountPage)
    expect(api.tokens).toHaveBeenCalledWith({ user: 'ada' })
    const logins = wrapper.find('[data-test=account-logins]')
    expect(logins.text()).toContain('Chrome on Linux')
    expect(logins.text()).toContain('this device')
    expect(logins.text()).not.toContain('nightly export')
    expect(wrapper.find('[data-test=account-scripts]').text()).toContain('nightly export')
    await wrapper.find('[data-test=revoke-2]').trigger('click')
    await settle()
    expect(api.revokeToken).toHaveBeenCalledWith(2)
    expect(session.token).toBe('mine') // still signed in here
    wrapper.unmount()
  })

  it('is reachable by every role, while the users page is for operators only', () => {
    const to = (path) => routes.find((route) => route.path === path)
    setSession('t', { username: 'v', role: 'viewer' })
    expect(guard({ ...to('/account'), fullPath: '/account' })).toBe(true)
    expect(guard({ ...to('/users'), fullPath: '/users' })).toEqual({ name: 'overview' })
    setSession('t', { username: 'o', role: 'operator' })
    expect(guard({ ...to('/users'), fullPath: '/users' })).toBe(true)
  })

  it('lets an operator change a role, disable a user and reset a password', async () => {
    setSession('t', { username: 'root', role: 'operator' })
    api.users.mockResolvedValue([
      { id: 1, username: 'root', role: 'operator', active: true, last_login: null, logins: 1, script_tokens: 0 },
      { id: 2, username: 'bea', role: 'viewer', active: true, last_login: null, logins: 2, script_tokens: 1 },
    ])
    api.tokens.mockResolvedValue([])
    api.updateUser.mockResolvedValue({})
    const { wrapper } = await mountPage(UsersPage)
    const row = wrapper.find('[data-test=user-bea]')
    expect(row.text()).toContain('2 / 1')
    await row.findComponent({ name: 'ElSwitch' }).vm.$emit('change', false)
    await settle()
    expect(api.updateUser).toHaveBeenCalledWith(2, { active: false })
    await row.findComponent({ name: 'ElSelect' }).vm.$emit('change', 'provider')
    await settle()
    expect(api.updateUser).toHaveBeenCalledWith(2, { role: 'provider' })
    await row.find('[data-test=user-reset]').trigger('click')
    await settle()
    wrapper.vm.newPassword = 'a-new-password-1'
    await wrapper.vm.reset()
    expect(api.updateUser).toHaveBeenCalledWith(2, { password: 'a-new-password-1' })
    wrapper.unmount()
  })

  it('shows a new token\'s key once', async () => {
    setSession('t', { username: 'ada', role: 'provider' })
    api.tokens.mockResolvedValue([])
    api.createToken.mockResolvedValue({ ...token(9, 'script', 'export'), token: 'abcd1234' + 'f'.repeat(32) })
    const { wrapper } = await mountPage(AccountPage)
    await wrapper.find('input[data-test=token-name]').setValue('export')
    await wrapper.find('[data-test=token-form]').trigger('submit')
    await settle()
    expect(api.createToken).toHaveBeenCalledWith({ name: 'export', days: 90 })
    expect(wrapper.find('[data-test=token-key]').text()).toBe('abcd1234' + 'f'.repeat(32))
    wrapper.unmount()
  })
})

describe('times as a person reads them', () => {
  it('says how far a moment is from now, both ways', () => {
    const now = Date.parse('2026-12-05T12:00:00Z')
    expect(fromNow('2026-12-05T12:03:00Z', now)).toBe('in 3 minutes')
    expect(fromNow('2026-12-05T11:00:00Z', now)).toBe('1 hour ago')
    expect(fromNow(Date.parse('2026-12-05T12:00:05Z') / 1000, now)).toBe('just now')
    expect(fromNow(Date.parse('2026-12-07T12:00:00Z') / 1000, now)).toBe('in 2 days')
  })
})
