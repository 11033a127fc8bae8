// Signs in as each role, visits every page, checks the role gating and that nothing
// logs a console error, and saves a screenshot of each page.
//
//   DEFL_URL=http://127.0.0.1:8000 \
//   DEFL_USERS=operator:op:pw,provider:prov:pw,viewer:view:pw \
//   DEFL_SCREENSHOTS=out/screenshots node e2e/roles.mjs
//
// The last line printed is a JSON summary; the exit status is 0 only when every check passed.
import { LAPTOP, TABLET, check, launch, requireEnv, screenshotter, settled, signIn, signOut, watchConsole } from './browser.mjs'

const baseUrl = requireEnv('DEFL_URL')
const users = requireEnv('DEFL_USERS')
  .split(',')
  .map((entry) => {
    const [role, username, ...rest] = entry.split(':')
    return { role, username, password: rest.join(':') }
  })
const shots = screenshotter(process.env.DEFL_SCREENSHOTS || 'out/screenshots')

const failures = []
let current = 'start'
const browser = await launch()
const page = await browser.context.newPage()
const consoleErrors = watchConsole(page, () => current)
const visited = {}

async function visit(role, name, path, selector) {
  current = `${role} ${path}`
  await page.goto(`${baseUrl}${path}`)
  await settled(page, selector)
  const errorStates = await page.locator('[data-test=error] .el-alert__title').allInnerTexts()
  check(failures, !errorStates.length, `${current}: shows an error state: ${errorStates.join('; ')}`)
  await shots.shot(page, `${role}-${name}`)
  visited[role].push(path)
}

try {
  for (const [index, { role, username, password }] of users.entries()) {
    visited[role] = []
    current = `${role} sign in`
    // A deep link while signed out goes to sign in and comes back after it.
    await page.goto(`${baseUrl}/datasets`)
    await page.waitForURL((url) => url.pathname === '/login', { timeout: 20000 })
    check(failures, new URL(page.url()).searchParams.get('redirect') === '/datasets', `${role}: sign-in page lost the redirect target`)
    if (index === 0) await shots.shot(page, 'sign-in')
    if (role === 'viewer') {
      // The sign-in form works from the keyboard alone.
      await page.locator('input[data-test=username-input]').focus()
      await page.keyboard.type(username)
      await page.keyboard.press('Tab')
      await page.keyboard.type(password)
      await page.keyboard.press('Enter')
      await page.waitForURL((url) => url.pathname === '/datasets', { timeout: 20000 })
    } else {
      await page.locator('input[data-test=username-input]').fill(username)
      await page.locator('input[data-test=password-input]').fill(password)
      await page.locator('[data-test=sign-in-submit]').click()
      await page.waitForURL((url) => url.pathname === '/datasets', { timeout: 20000 })
    }
    check(failures, (await page.locator('[data-test=role]').innerText()).trim() === role, `${role}: header shows the wrong role`)
    check(failures, (await page.locator('.el-menu-item:visible').count()) === 4, `${role}: the main menu does not show its four pages`)

    if (role === 'viewer') {
      // The main menu is reachable and usable from the keyboard.
      current = `${role} keyboard menu`
      await page.locator('.el-menu-item', { hasText: 'Jobs' }).focus()
      await page.keyboard.press('Enter')
      await page.waitForURL((url) => url.pathname === '/jobs', { timeout: 20000 })
    }
    await visit(role, 'overview', '/', '[data-test=overview-page]')
    await visit(role, 'datasets', '/datasets', '[data-test=datasets-page]')
    const mayUpload = role !== 'viewer'
    check(failures, (await page.locator('[data-test=upload-form]').count()) === (mayUpload ? 1 : 0), `${role}: upload form ${mayUpload ? 'missing' : 'offered'}`)
    if (role === 'provider') {
      // The API's 400 for a bad upload shows next to the field it concerns.
      current = `${role} upload error`
      const before = consoleErrors.length
      await page.locator('input[data-test=file-input]').setInputFiles({ name: 'tiny.csv', mimeType: 'text/csv', buffer: Buffer.from('a,b,label\n1,2,0\n3,4,1\n') })
      await page.locator('input[data-test=label-input]').fill('no-such-column')
      await page.locator('[data-test=upload-submit]').click()
      const fieldError = page.locator('.el-form-item.is-error .el-form-item__error').first()
      await fieldError.waitFor({ timeout: 20000 })
      check(failures, (await fieldError.innerText()).includes('no-such-column'), `${role}: the upload error does not name the bad column`)
      await shots.shot(page, `${role}-upload-error`)
      // That 400 is the expected answer, not a fault of the page.
      const expected = consoleErrors.slice(before).filter((error) => error.includes('status of 400'))
      check(failures, expected.length === 1, `${role}: expected one 400 response for the bad upload`)
      consoleErrors.splice(before, consoleErrors.length - before, ...consoleErrors.slice(before).filter((error) => !error.includes('status of 400')))
      // Corrected, the upload goes through (encrypted, stored) and opens the dataset's page.
      current = `${role} upload`
      const rows = Array.from({ length: 40 }, (_v, i) => `${(i * 0.37 + Math.random()).toFixed(4)},${((i * 7) % 11) / 11},${i % 2}`)
      await page.locator('input[data-test=file-input]').setInputFiles({ name: 'e2e-roles.csv', mimeType: 'text/csv', buffer: Buffer.from(`a,b,label\n${rows.join('\n')}\n`) })
      await page.locator('input[data-test=label-input]').fill('label')
      await page.locator('[data-test=upload-submit]').click()
      await page.locator('[data-test=upload-progress]').waitFor({ timeout: 10000 })
      await page.waitForURL(/\/datasets\/\d+$/, { timeout: 60000 })
      await settled(page, '[data-test=dataset-page]')
      await page.goto(`${baseUrl}/datasets`)
      await settled(page, '[data-test=datasets-page]')
    }
    const firstDataset = page.locator('[data-test=datasets-table] a').first()
    if (await firstDataset.count()) {
      const href = await firstDataset.getAttribute('href')
      await visit(role, 'dataset', href, '[data-test=dataset-page]')
      check(failures, (await page.locator('[data-test=grant-form]').count()) === (mayUpload ? 1 : 0), `${role}: grant form ${mayUpload ? 'missing' : 'offered'}`)
    }

    await visit(role, 'jobs', '/jobs', '[data-test=jobs-page]')
    const mayCreateJobs = role === 'operator'
    check(failures, (await page.locator('[data-test=new-job]').count()) === (mayCreateJobs ? 1 : 0), `${role}: "New job" ${mayCreateJobs ? 'missing' : 'offered'}`)
    const firstJob = page.locator('[data-test=jobs-table] a').first()
    if (await firstJob.count()) {
      const href = await firstJob.getAttribute('href')
      await visit(role, 'job', href, '[data-test=job-page]')
      if (!mayCreateJobs) check(failures, !(await page.locator('[data-test=job-actions]').count()), `${role}: job actions offered`)
    }
    if (mayCreateJobs) {
      await visit(role, 'job-new', '/jobs/new', '[data-test=job-create-page]')
      // The form's own validation: an empty name is refused before any request.
      await page.locator('[data-test=job-submit]').click()
      await page.locator('.el-form-item.is-error').first().waitFor({ timeout: 5000 })
      await shots.shot(page, `${role}-job-new-invalid`)
    } else {
      current = `${role} /jobs/new`
      await page.goto(`${baseUrl}/jobs/new`)
      await page.waitForURL((url) => url.pathname === '/', { timeout: 20000 })
      visited[role].push('/jobs/new (redirected)')
    }
    await visit(role, 'models', '/models', '[data-test=models-page]')

    if (role === 'operator') {
      await page.setViewportSize(TABLET)
      await visit(role, 'overview-tablet', '/', '[data-test=overview-page]')
      await visit(role, 'datasets-tablet', '/datasets', '[data-test=datasets-page]')
      await page.setViewportSize(LAPTOP)
    }
    current = `${role} sign out`
    await signOut(page)
  }

  // A token the node no longer accepts (signed out elsewhere) leads back to sign in.
  // This one 401 is expected, so it is checked after the console check below.
  const errorsBefore = consoleErrors.length
  const { role, username, password } = users[0]
  current = `${role} expired token`
  await signIn(page, baseUrl, username, password)
  const stale = await page.evaluate(() => sessionStorage.getItem('defl.session'))
  await signOut(page)
  await page.evaluate((saved) => sessionStorage.setItem('defl.session', saved), stale)
  await page.goto(`${baseUrl}/models`)
  await page.waitForURL((url) => url.pathname === '/login', { timeout: 20000 })
  consoleErrors.splice(errorsBefore) // the 401 responses of the stale token
} catch (error) {
  failures.push(`${current}: ${error.message.split('\n')[0]}`)
  await shots.shot(page, 'failure').catch(() => {})
} finally {
  await browser.close()
}

for (const error of consoleErrors) failures.push(error)
const summary = { ok: failures.length === 0, failures, visited, screenshots: shots.taken.length }
for (const failure of failures) console.error(`FAIL ${failure}`)
console.log(JSON.stringify(summary))
process.exit(summary.ok ? 0 : 1)
