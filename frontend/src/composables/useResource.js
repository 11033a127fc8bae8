// Loads something from the API and keeps its loading / error / data state.
// `loading` is true only until the first answer, so that a refresh (polling)
// does not flash the loading state over data already shown.
import { ref, shallowRef } from 'vue'

export function useResource(loader, { initial = null } = {}) {
  const data = shallowRef(initial)
  const error = ref(null)
  const loading = ref(true)
  let latest = 0

  async function refresh() {
    const call = ++latest
    try {
      const value = await loader()
      if (call !== latest) return
      data.value = value
      error.value = null
    } catch (err) {
      if (call !== latest) return
      error.value = err
    } finally {
      if (call === latest) loading.value = false
    }
  }

  return { data, error, loading, refresh }
}
