// Calls `task` now and then every `intervalMs` while `active()` is true and the
// tab is visible; the next call is scheduled after the previous one finished,
// so slow answers never pile up. Stops when the component unmounts.
import { onBeforeUnmount, onMounted, watch } from 'vue'

export function usePolling(task, intervalMs, { active = () => true, immediate = true } = {}) {
  let timer = null
  let stopped = false
  let running = false

  const visible = () => typeof document === 'undefined' || document.visibilityState !== 'hidden'

  function schedule() {
    clearTimeout(timer)
    if (stopped || !active()) return
    timer = setTimeout(tick, intervalMs)
  }

  async function tick() {
    if (stopped || running) return
    if (!visible() || !active()) return schedule()
    running = true
    try {
      await task()
    } finally {
      running = false
      schedule()
    }
  }

  function onVisibility() {
    if (visible()) tick()
  }

  onMounted(() => {
    document.addEventListener('visibilitychange', onVisibility)
    if (immediate) tick()
    else schedule()
  })
  onBeforeUnmount(() => {
    stopped = true
    clearTimeout(timer)
    document.removeEventListener('visibilitychange', onVisibility)
  })
  // Resume when the condition becomes true again (e.g. a job restarted).
  watch(active, (isActive) => isActive && schedule())

  return { refresh: tick }
}
