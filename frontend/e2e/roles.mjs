// Signs in as each role, visits every page by clicking (the menu, table links, buttons: only
// the deep-link checks type a URL), checks the role gating and that nothing logs a console
// error, and saves a screenshot of each page; the operator also at 390 px (a phone), and the
// sign-in is checked to hold in a second tab and to end everywhere on sign-out.
//
//   DEFL_URL=http://127.0.0.1:8000 \
//   DEFL_USERS=operator:op:pw,provider:prov:pw,viewer:view:pw \
//   DEFL_SCREENSHOTS=out/screenshots node e2e/roles.mjs
//
// The last line printed is a JSON summary; the exit status is 0 only when every check passed.
import { LAPTOP, PHONE, TABLET, check, launch, requireEnv, screenshotter, settled, signIn, signOut, watchConsole } from './browser.mjs'

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

const NAV = { '/': 'nav-overview', '/datasets': 'nav-datasets', '/jobs': 'nav-jobs', '/models': 'nav-models' }

// Reaches `path` by clicking: the main menu for a section, else the given link or button.
async function visit(role, name, path, selector, clickable = null) {
  current = `${role} ${path}`
  await (clickable || page.locator(`[data-test=${NAV[path]}]`)).click()
  await page.waitForURL((url) => url.pathname === path, { timeout: 20000 })
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
    // Five sections for everyone, and Users for an operator.
    const sections = role === 'operator' ? 6 : 5
    check(failures, (await page.locator('nav[aria-label=Main] a:visible').count()) === sections, `${role}: the main menu does not show its ${sections} sections`)

    if (role === 'viewer') {
      // The main menu is reachable and usable from the keyboard.
      current = `${role} keyboard menu`
      await page.locator('[data-test=nav-jobs]').focus()
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
      await page.locator('input[data-test=classes-input]').fill('0,1')
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
      await visit(role, 'datasets-after-upload', '/datasets', '[data-test=datasets-page]')
    }
    const firstDataset = page.locator('[data-test=datasets-table] a').first()
    if (await firstDataset.count()) {
      const href = await firstDataset.getAttribute('href')
      await visit(role, 'dataset', href, '[data-test=dataset-page]', firstDataset)
      check(failures, (await page.locator('[data-test=grant-form]').count()) === (mayUpload ? 1 : 0), `${role}: grant form ${mayUpload ? 'missing' : 'offered'}`)
    }

    await visit(role, 'jobs', '/jobs', '[data-test=jobs-page]')
    const mayCreateJobs = role === 'operator'
    check(failures, (await page.locator('[data-test=new-job]').count()) === (mayCreateJobs ? 1 : 0), `${role}: "New job" ${mayCreateJobs ? 'missing' : 'offered'}`)
    const firstJob = page.locator('[data-test=jobs-table] a').first()
    if (await firstJob.count()) {
      const href = await firstJob.getAttribute('href')
      await visit(role, 'job', href, '[data-test=job-page]', firstJob)
      if (!mayCreateJobs) check(failures, !(await page.locator('[data-test=job-actions]').count()), `${role}: job actions offered`)
    }
    if (mayCreateJobs) {
      if (await firstJob.count()) await visit(role, 'jobs', '/jobs', '[data-test=jobs-page]')
      // The "New job" button itself leads to the form (it once cancelled its own navigation).
      await visit(role, 'job-new', '/jobs/new', '[data-test=job-create-page]', page.locator('[data-test=new-job]'))
      // A lone node cannot start a job (committee + trainers need more members): the wizard says
      // so before anything is sent, and offers no button that would create an unstartable job.
      await page.locator('[data-test=job-plan-problems]').waitFor({ timeout: 10000 })
      check(failures, (await page.locator('[data-test=job-plan-problems]').innerText()).includes('can join'), `${role}: the wizard does not say who can join`)
      check(failures, await page.locator('[data-test=job-submit]').isDisabled(), `${role}: an unstartable job can be submitted`)
      await shots.shot(page, `${role}-job-new-unstartable`)
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
      // A phone: all five sections stay visible in the menu, and no page is wider than the screen.
      await page.setViewportSize(PHONE)
      for (const [path, name, selector] of [
        ['/', 'overview', '[data-test=overview-page]'],
        ['/datasets', 'datasets', '[data-test=datasets-page]'],
        ['/jobs', 'jobs', '[data-test=jobs-page]'],
        ['/models', 'models', '[data-test=models-page]'],
      ]) {
        check(failures, (await page.locator('nav[aria-label=Main] a:visible').count()) === 6, `${role} phone: the menu hides sections`)
        await visit(role, `${name}-phone`, path, selector)
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
        check(failures, overflow <= 1, `${role} phone ${path}: the page is ${overflow} px wider than the screen`)
      }
      await page.setViewportSize(LAPTOP)
    }
    current = `${role} sign out`
    await signOut(page)
  }

  // The sign-in holds in a second tab (a link opened there is not asked to sign in again), and a
  // sign-out in one tab ends it in the other.
  const errorsBefore = consoleErrors.length
  const { role, username, password } = users[0]
  current = `${role} second tab`
  await signIn(page, baseUrl, username, password)
  const second = await browser.context.newPage()
  const secondErrors = watchConsole(second, () => `${current} (second tab)`)
  await second.goto(`${baseUrl}/models`)
  await settled(second, '[data-test=models-page]')
  check(failures, new URL(second.url()).pathname === '/models', `${role}: a new tab was sent to sign in again`)
  check(failures, (await second.locator('[data-test=role]').innerText()).trim() === role, `${role}: the new tab does not know the user`)
  current = `${role} sign out everywhere`
  await signOut(page)
  // The other tab follows by itself (the shared storage changed), without a request failing.
  await second.waitForURL((url) => url.pathname === '/login', { timeout: 20000 })
  await second.close()
  check(failures, !secondErrors.length, `second tab: ${secondErrors.join('; ')}`)
  check(failures, consoleErrors.length === errorsBefore, 'signing out in one tab made requests fail')
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
