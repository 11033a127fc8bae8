import { describe, it, expect } from 'vitest'
import { mount } from '@vue/test-utils'
import BudgetGauge from '../src/components/datasets/BudgetGauge.vue'
import { budgetGaugeOption } from '../src/charts/options.js'

const budget = { epsilon_cap: 3, delta: 1e-5, epsilon_spent: 1.25, epsilon_left: 1.75, spent_by_jobs: [] }

describe('budget gauge', () => {
  it('scales the gauge to the cap and points at the spent epsilon', () => {
    const series = budgetGaugeOption(budget).series[0]
    expect(series.type).toBe('gauge')
    expect(series.min).toBe(0)
    expect(series.max).toBe(3)
    expect(series.data[0].value).toBe(1.25)
    expect(series.detail.formatter()).toBe('1.25 / 3')
  })

  it('never draws past the cap, and turns red when nearly spent', () => {
    const series = budgetGaugeOption({ epsilon_cap: 2, epsilon_spent: 2.5 }).series[0]
    expect(series.data[0].value).toBe(2)
    expect(series.detail.formatter()).toBe('2.5 / 2')
    expect(series.itemStyle.color).toBe('#f56c6c')
  })

  it('shows spent, cap, left and delta as numbers beside the chart', () => {
    const wrapper = mount(BudgetGauge, { props: { budget } })
    expect(wrapper.find('[data-test=budget-spent]').text()).toBe('1.25')
    expect(wrapper.find('[data-test=budget-cap]').text()).toBe('3.00')
    expect(wrapper.find('[data-test=budget-left]').text()).toBe('1.75')
    expect(wrapper.find('[data-test=budget-delta]').text()).toBe('0.00001')
    expect(wrapper.find('.echart-stub').attributes('aria-label')).toContain('1.25 spent of 3.00')
  })

  it('computes what is left when the API leaves it out', () => {
    const wrapper = mount(BudgetGauge, { props: { budget: { epsilon_cap: 4, epsilon_spent: 1, delta: 1e-6 } } })
    expect(wrapper.find('[data-test=budget-left]').text()).toBe('3.00')
  })
})
