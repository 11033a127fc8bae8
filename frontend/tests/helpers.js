import { flushPromises } from '@vue/test-utils'

// Element Plus validation and our API calls settle over several microtasks and timers;
// a form item shows its error message 100 ms after its state changes (debounced).
export async function settle(waitMs = 150) {
  for (let i = 0; i < 3; i += 1) {
    await flushPromises()
    await new Promise((resolve) => setTimeout(resolve, 0))
  }
  await new Promise((resolve) => setTimeout(resolve, waitMs))
  await flushPromises()
}
