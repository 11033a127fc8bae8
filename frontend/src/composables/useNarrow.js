// True on a phone-sized screen (the same breakpoint as styles.css), kept up to date on resize.
import { onBeforeUnmount, ref } from 'vue'

export const NARROW_QUERY = '(max-width: 700px)'

export function useNarrow() {
  const query = typeof window !== 'undefined' && window.matchMedia ? window.matchMedia(NARROW_QUERY) : null
  const narrow = ref(Boolean(query?.matches))
  const update = (event) => (narrow.value = event.matches)
  query?.addEventListener?.('change', update)
  onBeforeUnmount(() => query?.removeEventListener?.('change', update))
  return narrow
}
