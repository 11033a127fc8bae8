import { createApp } from 'vue'
import App from './App.vue'
import { router } from './router.js'
import { setUnauthorizedHandler } from './lib/api.js'
import './styles.css'

setUnauthorizedHandler(() => {
  const current = router.currentRoute.value
  if (current.name !== 'login') router.replace({ name: 'login', query: { redirect: current.fullPath } })
})

createApp(App).use(router).mount('#app')
