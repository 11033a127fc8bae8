// Every page but the overview is its own chunk (lazy routes); the overview, where nearly every
// visit starts, comes with the entry so that its code is not a second round trip. Routes carry
// the action they need, so a role that may not do it is sent back to the overview.
import { createRouter, createWebHistory } from 'vue-router'
import OverviewPage from './pages/OverviewPage.vue'
import { onSessionChange, session } from './lib/session.js'
import { can } from './lib/permissions.js'

export const routes = [
  { path: '/login', name: 'login', component: () => import('./pages/SignInPage.vue'), meta: { public: true, title: 'Sign in' } },
  { path: '/', name: 'overview', component: OverviewPage, meta: { title: 'Overview' } },
  { path: '/datasets', name: 'datasets', component: () => import('./pages/DatasetsPage.vue'), meta: { title: 'Datasets' } },
  { path: '/datasets/:id', name: 'dataset', component: () => import('./pages/DatasetPage.vue'), props: true, meta: { title: 'Dataset' } },
  { path: '/jobs', name: 'jobs', component: () => import('./pages/JobsPage.vue'), meta: { title: 'Jobs' } },
  { path: '/jobs/new', name: 'job-new', component: () => import('./pages/JobCreatePage.vue'), meta: { title: 'New job', action: 'jobs:write' } },
  { path: '/jobs/:id', name: 'job', component: () => import('./pages/JobPage.vue'), props: true, meta: { title: 'Job' } },
  { path: '/models', name: 'models', component: () => import('./pages/ModelsPage.vue'), meta: { title: 'Models' } },
  { path: '/cluster', name: 'cluster', component: () => import('./pages/ClusterPage.vue'), meta: { title: 'Cluster' } },
  { path: '/account', name: 'account', component: () => import('./pages/AccountPage.vue'), meta: { title: 'Your account' } },
  { path: '/users', name: 'users', component: () => import('./pages/UsersPage.vue'), meta: { title: 'Users', action: 'users:manage' } },
  { path: '/:rest(.*)*', name: 'not-found', component: () => import('./pages/NotFoundPage.vue'), meta: { title: 'Not found' } },
]

export function guard(to) {
  if (to.meta.public) return true
  if (!session.token) return { name: 'login', query: to.fullPath === '/' ? {} : { redirect: to.fullPath } }
  if (to.meta.action && !can(session.user?.role, to.meta.action)) return { name: 'overview' }
  return true
}

export const router = createRouter({ history: createWebHistory('/'), routes })
router.beforeEach(guard)
// Signed out in another tab: this one leaves its page too.
onSessionChange((state) => {
  const current = router.currentRoute.value
  if (!state.token && !current.meta.public) router.replace({ name: 'login' })
})
router.afterEach((to) => {
  document.title = `${to.meta.title || 'DeFL'} · DeFL node`
})
