// Pure builders of ECharts options, kept apart from components so tests can check the numbers.
const round2 = (value) => Math.round(Number(value || 0) * 100) / 100

export function budgetGaugeOption(budget) {
  const cap = Number(budget?.epsilon_cap) || 0
  const spent = Number(budget?.epsilon_spent) || 0
  const ratio = cap > 0 ? spent / cap : 0
  return {
    series: [
      {
        type: 'gauge',
        min: 0,
        max: cap > 0 ? round2(cap) : 1,
        splitNumber: 4,
        progress: { show: true, width: 14 },
        axisLine: {
          lineStyle: {
            width: 14,
            color: [
              [0.7, '#67c23a'],
              [0.9, '#e6a23c'],
              [1, '#f56c6c'],
            ],
          },
        },
        itemStyle: { color: ratio >= 0.9 ? '#f56c6c' : ratio >= 0.7 ? '#e6a23c' : '#409eff' },
        pointer: { show: false },
        axisTick: { show: false },
        splitLine: { length: 8, lineStyle: { width: 1 } },
        axisLabel: { distance: 18, fontSize: 10, formatter: (v) => round2(v) },
        title: { show: true, offsetCenter: [0, '70%'], fontSize: 12 },
        detail: { valueAnimation: true, offsetCenter: [0, '20%'], fontSize: 20, formatter: () => `${round2(spent)} / ${round2(cap)}` },
        data: [{ value: round2(Math.min(spent, cap || spent)), name: 'ε spent / cap' }],
      },
    ],
  }
}

export function roundMetricsOption(rounds) {
  const done = (rounds || []).filter((round) => round.metrics && Object.keys(round.metrics).length)
  const x = done.map((round) => `R${round.round}`)
  const pick = (key) => done.map((round) => (round.metrics[key] == null ? null : round2(round.metrics[key] * (key === 'accuracy' ? 100 : 1))))
  return {
    tooltip: { trigger: 'axis' },
    legend: { top: 0 },
    grid: { left: 48, right: 48, top: 36, bottom: 28 },
    xAxis: { type: 'category', data: x, boundaryGap: false },
    yAxis: [
      { type: 'value', name: 'accuracy %', min: 0, max: 100, position: 'left' },
      { type: 'value', name: 'loss / ε', position: 'right', splitLine: { show: false } },
    ],
    series: [
      { name: 'accuracy %', type: 'line', data: pick('accuracy'), yAxisIndex: 0, smooth: true, connectNulls: true },
      { name: 'loss', type: 'line', data: pick('loss'), yAxisIndex: 1, smooth: true, connectNulls: true },
      { name: 'ε spent', type: 'line', data: pick('epsilon'), yAxisIndex: 1, connectNulls: true, lineStyle: { type: 'dashed' } },
    ],
  }
}
