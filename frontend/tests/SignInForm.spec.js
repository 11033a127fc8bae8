import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, api: { login: vi.fn() } }
})

import SignInForm from '../src/components/common/SignInForm.vue'
import { api, ApiError } from '../src/lib/api.js'
import { session, clearSession } from '../src/lib/session.js'

describe('SignInForm', () => {
  beforeEach(() => {
    clearSession()
    api.login.mockReset()
  })

  it('asks for both fields before calling the API', async () => {
    const wrapper = mount(SignInForm, { attachTo: document.body })
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.login).not.toHaveBeenCalled()
    expect(wrapper.findAll('.el-form-item.is-error')).toHaveLength(2)
    expect(wrapper.text()).toContain('Enter your username')
    expect(wrapper.text()).toContain('Enter your password')
    wrapper.unmount()
  })

  it('signs in, keeps the token for every tab of this origin and reports the user', async () => {
    api.login.mockResolvedValue({ token: 'abc123', user: { username: 'ada', role: 'operator' } })
    const wrapper = mount(SignInForm, { attachTo: document.body })
    await wrapper.find('input[data-test=username-input]').setValue('  ada ')
    await wrapper.find('input[data-test=password-input]').setValue('secret-pass')
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(api.login).toHaveBeenCalledWith('ada', 'secret-pass')
    expect(session.token).toBe('abc123')
    expect(session.user).toEqual({ username: 'ada', role: 'operator' })
    expect(JSON.parse(localStorage.getItem('defl.session')).user.role).toBe('operator')
    expect(wrapper.emitted('signed-in')[0][0]).toEqual({ username: 'ada', role: 'operator' })
    wrapper.unmount()
  })

  it('shows a clear message on wrong credentials and keeps no session', async () => {
    api.login.mockRejectedValue(new ApiError(401, 'wrong username or password'))
    const wrapper = mount(SignInForm, { attachTo: document.body })
    await wrapper.find('input[data-test=username-input]').setValue('ada')
    await wrapper.find('input[data-test=password-input]').setValue('nope')
    await wrapper.find('form').trigger('submit')
    await settle()
    expect(wrapper.find('[data-test=sign-in-error]').text()).toContain('Wrong username or password')
    expect(session.user).toBeNull()
    expect(wrapper.emitted('signed-in')).toBeUndefined()
    wrapper.unmount()
  })
})
