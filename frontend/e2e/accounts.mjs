// Accounts in the browser, against a real node: the operator creates a user, changes its role,
// resets its password and disables it; two devices of one user sign in and out apart (a logout
// ends that device's login only, and one device can sign the other out from the account page);
// a script token is created (its key shown once), works, and stops when revoked; a provider and
// a viewer see their own account but not the users page; the upload form states its rules and
// refuses a file over the node's limit before sending it; the job form puts the node's refusal
// beside the field.
//
//   DEFL_URL=http://127.0.0.1:8000 DEFL_USERS=operator:op:pw,provider:prov:pw,viewer:view:pw \
//   DEFL_SCREENSHOTS=out/screenshots node e2e/accounts.mjs
//
// The last line printed is a JSON summary; the exit status is 0 only when every check passed.
import { PHONE, check, launch, requireEnv, screenshotter, settled, signIn, signOut, watchConsole } from './browser.mjs'

const baseUrl = requireEnv('DEFL_URL')
const users = Object.fromEntries(
  requireEnv('DEFL_USERS')
    .split(',')
    .map((entry) => {
      const [role, username, ...rest] = entry.split(':')
      return [role, { username, password: rest.join(':') }]
    }),
)
const shots = screenshotter(process.env.DEFL_SCREENSHOTS || 'out/screenshots')
const failures = []
const steps = []
let current = 'start'

// Expected refusals the pages ask for on purpose (a 401 after being signed out elsewhere, a
// failed sign-in of a disabled account): the console shows them, they are not faults.
const EXPECTED = [/status of 401/, /status of 409/]
const unexpected = (errors) => errors.filter((error) => !EXPECTED.some((pattern) => pattern.test(error)))

async function api(path, token, init = {}) {
  const response = await fetch(`${baseUrl}${path}`, { ...init, headers: { ...(init.headers || {}), Authorization: `Token ${token}` } })
  return response.status
}

// A device whose login ended elsewhere finds out at its next request (a reload makes one now,
// rather than waiting for a poll): it lands on the sign-in page.
async function signedOutHere(page) {
  await page.reload()
  await page.waitForURL((url) => url.pathname === '/login', { timeout: 20000 })
}

async function go(page, test, selector) {
  await page.locator(`[data-test=${test}]`).click()
  await settled(page, selector)
}

const laptop = await launch()
const phone = await launch()
const deviceA = await laptop.context.newPage()
const deviceB = await phone.context.newPage()
await deviceB.setViewportSize(PHONE)
const errorsA = watchConsole(deviceA, () => `device A: ${current}`)
const errorsB = watchConsole(deviceB, () => `device B: ${current}`)
const op = users.operator
const newUser = { username: `e2e-user-${Date.now() % 100000}`, password: 'first-password-1', second: 'second-password-2' }

try {
  // ------------------------------------------------------------------ the operator manages users
  current = 'operator signs in on device A'
  await signIn(deviceA, baseUrl, op.username, op.password)
  check(failures, (await deviceA.locator('[data-test=nav-users]').count()) === 1, 'the operator has no Users section')
  await go(deviceA, 'nav-users', '[data-test=users-page]')
  current = 'create a user'
  await deviceA.locator('input[data-test=new-username]').fill(newUser.username)
  await deviceA.locator('[data-test=new-role]').click()
  await deviceA.locator('.el-select-dropdown__item:visible', { hasText: 'data provider' }).click()
  await deviceA.locator('input[data-test=new-password]').fill(newUser.password)
  await deviceA.locator('[data-test=user-create]').click()
  const row = deviceA.locator(`[data-test=user-${newUser.username}]`)
  await row.waitFor({ timeout: 20000 })
  check(failures, (await row.locator('[data-test=user-role]').innerText()).includes('provider'), 'the new user does not have its role')
  await shots.shot(deviceA, 'operator-users')
  steps.push('user created')

  current = 'the new user signs in on device B, then its role changes'
  await signIn(deviceB, baseUrl, newUser.username, newUser.password)
  check(failures, (await deviceB.locator('[data-test=role]').innerText()).trim() === 'provider', 'device B: the new user is not a provider')
  await row.locator('[data-test=user-role]').click()
  await deviceA.locator('.el-select-dropdown__item:visible', { hasText: 'viewer' }).click()
  await deviceA.locator('.el-message', { hasText: 'is now viewer' }).waitFor({ timeout: 20000 })
  steps.push('role changed')

  current = 'password reset ends the user\'s logins'
  await row.locator('[data-test=user-reset]').click()
  await deviceA.locator('input[data-test=reset-password]').fill(newUser.second)
  await deviceA.locator('[data-test=reset-submit]').click()
  await deviceA.locator('.el-message', { hasText: 'New password set' }).waitFor({ timeout: 20000 })
  await signedOutHere(deviceB)
  await signIn(deviceB, baseUrl, newUser.username, newUser.second)
  check(failures, (await deviceB.locator('[data-test=role]').innerText()).trim() === 'viewer', 'device B: the new role did not hold')
  steps.push('password reset')

  current = 'disabling the user signs it out and refuses its sign-in'
  await row.locator('[data-test=user-active]').click()
  await deviceA.locator('.el-message', { hasText: 'is disabled' }).waitFor({ timeout: 20000 })
  await signedOutHere(deviceB)
  await deviceB.locator('input[data-test=username-input]').fill(newUser.username)
  await deviceB.locator('input[data-test=password-input]').fill(newUser.second)
  await deviceB.locator('[data-test=sign-in-submit]').click()
  await deviceB.locator('[data-test=sign-in-error]').waitFor({ timeout: 20000 })
  await row.locator('[data-test=user-active]').click()
  await deviceA.locator('.el-message', { hasText: 'may sign in again' }).waitFor({ timeout: 20000 })
  steps.push('disabled and enabled')

  // ------------------------------------------------------------------ two devices of one user
  current = 'the operator signs in on device B too'
  await signIn(deviceB, baseUrl, op.username, op.password)
  await go(deviceA, 'username', '[data-test=account-page]')
  const logins = deviceA.locator('[data-test=account-logins] tbody tr')
  check(failures, (await logins.count()) >= 2, 'the account page does not list both devices')
  check(failures, (await deviceA.locator('[data-test=account-logins] [data-test=token-current]').count()) === 1, 'this device is not marked')
  await shots.shot(deviceA, 'operator-account-two-devices')

  current = 'device B signs out: device A stays signed in'
  await signOut(deviceB)
  await deviceA.reload()
  await settled(deviceA, '[data-test=account-page]')
  check(failures, new URL(deviceA.url()).pathname === '/account', 'device A was signed out by device B\'s sign-out')
  steps.push('one device signed out, the other not')

  current = 'device A signs device B out from its account page'
  await signIn(deviceB, baseUrl, op.username, op.password)
  await deviceA.reload()
  await settled(deviceA, '[data-test=account-page]')
  const other = deviceA.locator('[data-test=account-logins] tbody tr', { hasNot: deviceA.locator('[data-test=token-current]') }).first()
  await other.locator('button', { hasText: 'Sign out' }).click()
  await deviceA.locator('.el-message', { hasText: 'Signed out' }).waitFor({ timeout: 20000 })
  await signedOutHere(deviceB)
  await deviceA.locator('[data-test=nav-overview]').click()
  await settled(deviceA, '[data-test=overview-page]')
  check(failures, new URL(deviceA.url()).pathname === '/', 'device A lost its own login')
  steps.push('another device signed out from the account page')

  // ------------------------------------------------------------------ a script's token
  current = 'a script token'
  await go(deviceA, 'username', '[data-test=account-page]')
  await deviceA.locator('input[data-test=token-name]').fill('e2e script')
  await deviceA.locator('[data-test=token-create]').click()
  const key = (await deviceA.locator('[data-test=token-key]').innerText({ timeout: 20000 })).trim()
  check(failures, key.length === 40, 'the token key is not shown')
  check(failures, (await api('/api/auth/me', key)) === 200, 'the new script token does not work')
  const scriptRow = deviceA.locator('[data-test=account-scripts] tbody tr', { hasText: 'e2e script' })
  await scriptRow.locator('button', { hasText: 'Revoke' }).click()
  await deviceA.locator('.el-message', { hasText: 'Revoked' }).waitFor({ timeout: 20000 })
  check(failures, (await api('/api/auth/me', key)) === 401, 'a revoked script token still works')
  await shots.shot(deviceA, 'operator-account-tokens')
  steps.push('script token created, used, revoked')

  // ------------------------------------------------------------------ the job form's errors beside their fields
  current = 'job form'
  await go(deviceA, 'nav-jobs', '[data-test=jobs-page]')
  await deviceA.locator('[data-test=new-job]').click()
  await settled(deviceA, '[data-test=job-create-page]')
  await deviceA.locator('input[data-test=job-delta]').fill('1e-7')
  check(failures, (await deviceA.locator('input[data-test=job-delta]').inputValue()) === '1e-7', 'δ cannot be written as 1e-7')
  const committeeItem = deviceA.locator('.el-form-item', { has: deviceA.locator('input[aria-label="Committee size"]') })
  await committeeItem.locator('.el-form-item__error').waitFor({ timeout: 20000 })
  check(failures, (await committeeItem.locator('.el-form-item__error').innerText()).includes('can join'), 'the committee problem is not beside the committee field')
  await shots.shot(deviceA, 'operator-job-form')
  steps.push('job form')
  await signOut(deviceA)

  // ------------------------------------------------------------------ a provider and a viewer
  for (const role of ['provider', 'viewer']) {
    current = `${role}'s account`
    const { username, password } = users[role]
    await signIn(deviceA, baseUrl, username, password)
    check(failures, (await deviceA.locator('[data-test=nav-users]').count()) === 0, `${role} is offered the users page`)
    await go(deviceA, 'username', '[data-test=account-page]')
    check(failures, (await deviceA.locator('[data-test=account-logins] [data-test=token-current]').count()) === 1, `${role}: its login is not listed`)
    await deviceA.goto(`${baseUrl}/users`)
    await deviceA.waitForURL((url) => url.pathname === '/', { timeout: 20000 })
    if (role === 'provider') {
      current = 'provider upload form'
      await go(deviceA, 'nav-datasets', '[data-test=datasets-page]')
      check(failures, (await deviceA.locator('[data-test=upload-help]').innerText()).includes('1/(10·n)'), 'the upload form does not state the delta rule')
      const login = await (await fetch(`${baseUrl}/api/auth/login`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ username, password, device: 'e2e check' }) })).json()
      const limit = (await (await fetch(`${baseUrl}/api/jobs/limits`, { headers: { Authorization: `Token ${login.token}` } })).json()).max_upload_bytes
      check(failures, (await deviceA.locator('[data-test=upload-max-size]').innerText()).length > 1, 'the upload form does not state the size limit')
      if (limit <= 16 * 1024 * 1024) {
        await deviceA.locator('input[data-test=file-input]').setInputFiles({ name: 'big.csv', mimeType: 'text/csv', buffer: Buffer.alloc(limit + 1024, 'a') })
        const fileError = deviceA.locator('[data-test=field-file] .el-form-item__error')
        await fileError.waitFor({ timeout: 20000 })
        check(failures, (await fileError.innerText()).includes('takes uploads of at most'), 'a file over the limit is not refused before sending')
        await shots.shot(deviceA, 'provider-upload-too-large')
      }
    }
    await signOut(deviceA)
    steps.push(`${role} account`)
  }
} catch (error) {
  failures.push(`${current}: ${error.message.split('\n')[0]}`)
  await shots.shot(deviceA, 'accounts-failure-a').catch(() => {})
  await shots.shot(deviceB, 'accounts-failure-b').catch(() => {})
} finally {
  await laptop.close()
  await phone.close()
}

failures.push(...unexpected(errorsA), ...unexpected(errorsB))
for (const failure of failures) console.error(`FAIL ${failure}`)
console.log(JSON.stringify({ ok: failures.length === 0, failures, steps, screenshots: shots.taken.length }))
process.exit(failures.length ? 1 : 0)
