// happy-dom lacks a few browser APIs that Element Plus and ECharts touch.
import { config } from '@vue/test-utils'

if (!globalThis.ResizeObserver) {
  globalThis.ResizeObserver = class {
    observe() {}
    unobserve() {}
    disconnect() {}
  }
}
// Charts draw on canvas, which happy-dom does not have: component tests check the numbers, not pixels.
config.global.stubs = { EChart: { props: ['option', 'label', 'height'], template: '<div class="echart-stub" :aria-label="label" />' } }
// async-validator logs every failed rule to the console; the tests check the form state instead.
globalThis.ASYNC_VALIDATOR_NO_WARNING = 1
