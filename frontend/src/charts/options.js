// Pure builders of ECharts options, kept apart from components so tests can check the numbers.
const round2 = (value) => Math.round(Number(value || 0) * 100) / 100

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
      { name: 'ε spent (this node)', type: 'line', data: pick('epsilon'), yAxisIndex: 1, connectNulls: true, lineStyle: { type: 'dashed' } },
    ],
  }
}
