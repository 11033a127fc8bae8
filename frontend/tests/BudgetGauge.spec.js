import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import BudgetGauge from '../src/components/datasets/BudgetGauge.vue'
import BudgetSpendTable from '../src/components/datasets/BudgetSpendTable.vue'
import { budgetParts } from '../src/lib/budget.js'
import { settle } from './helpers.js'

const budget = { epsilon_cap: 3, delta: 1e-5, epsilon_spent: 1.25, epsilon_left: 1.75, spent_by_jobs: [] }
const width = (wrapper, part) => wrapper.find(`[data-test=budget-bar-${part}]`).attributes('style')

describe('budget bar', () => {
  it('is empty at zero: nothing coloured, 0% used', () => {
    const parts = budgetParts({ epsilon_cap: 10, epsilon_spent: 0 })
    expect(parts.spentPct).toBe(0)
    expect(parts.usedPct).toBe(0)
    const wrapper = mount(BudgetGauge, { props: { budget: { epsilon_cap: 10, epsilon_spent: 0, delta: 1e-5 } } })
    expect(width(wrapper, 'spent')).toContain('width: 0%')
    expect(wrapper.text()).toContain('0% of the cap used')
  })

  it('scales spent and reserved to the cap, never past it, and warns when nearly spent', () => {
    const parts = budgetParts({ epsilon_cap: 4, epsilon_spent: 1, epsilon_reserved: 1 })
    expect([parts.spentPct, parts.reservedPct, parts.usedPct, parts.left, parts.level]).toEqual([25, 25, 50, 2, 'ok'])
    const over = budgetParts({ epsilon_cap: 2, epsilon_spent: 2.5, epsilon_reserved: 1 })
    expect([over.spentPct, over.reservedPct, over.level]).toEqual([100, 0, 'danger'])
  })

  it('shows spent, cap, left and delta as numbers beside the bar', () => {
    const wrapper = mount(BudgetGauge, { props: { budget } })
    expect(wrapper.find('[data-test=budget-spent]').text()).toBe('1.25')
    expect(wrapper.find('[data-test=budget-cap]').text()).toBe('3.00')
    expect(wrapper.find('[data-test=budget-left]').text()).toBe('1.75')
    expect(wrapper.find('[data-test=budget-delta]').text()).toBe('0.00001')
    expect(wrapper.find('[data-test=budget-bar]').attributes('aria-label')).toContain('1.25 spent')
  })

  it('computes what is left when the API leaves it out', () => {
    const wrapper = mount(BudgetGauge, { props: { budget: { epsilon_cap: 4, epsilon_spent: 1, delta: 1e-6 } } })
    expect(wrapper.find('[data-test=budget-left]').text()).toBe('3.00')
  })

  it("explains why the composed total is below the sum of the jobs' shares", async () => {
    const spends = [
      { job: '1', epsilon: 2.445, rounds: 5 },
      { job: '2', epsilon: 2.467, rounds: 5 },
    ]
    const wrapper = mount(BudgetSpendTable, { props: { spends, total: 3.13, jobNames: { 1: 'mnist-a' } }, global: { stubs: { RouterLink: { template: '<a><slot /></a>' } } }, attachTo: document.body })
    await settle()
    const text = wrapper.find('[data-test=budget-explanation]').text()
    expect(text).toContain('ε 3.130')
    expect(text).toContain('add up to 4.912')
    expect(text).toContain('Rényi')
    expect(wrapper.find('[data-test=budget-spends]').text()).toContain('mnist-a')
    wrapper.unmount()
  })
})
