import { describe, it, expect } from 'vitest'
import { parseTextSample, pixelsToVector, SampleError } from '../src/lib/sampleInput.js'
import { flattenErrors } from '../src/lib/fieldErrors.js'
import { effectivePhase, normalizePhase, formatScore } from '../src/lib/rounds.js'
import { roundMetricsOption } from '../src/charts/options.js'

describe('predict sample parsing', () => {
  it('reads a JSON row, JSON rows, {inputs} and a CSV row with a header', () => {
    expect(parseTextSample('[1, 2.5, 3]')).toEqual([[1, 2.5, 3]])
    expect(parseTextSample('[[1,2],[3,4]]')).toEqual([
      [1, 2],
      [3, 4],
    ])
    expect(parseTextSample('{"inputs": [[0, 1]]}')).toEqual([[0, 1]])
    expect(parseTextSample('a,b,c\n0.1,0.2,0.3')).toEqual([[0.1, 0.2, 0.3]])
  })

  it('rejects non-numeric values with a sentence', () => {
    expect(() => parseTextSample('[1, "x"]')).toThrow(SampleError)
    expect(() => parseTextSample('1,2\n3,oops')).toThrow(/CSV row 2/)
    expect(() => parseTextSample('')).toThrow(/Enter a sample/)
  })

  it('turns RGBA pixels into grayscale values in [0, 1]', () => {
    expect(pixelsToVector([255, 255, 255, 255, 0, 0, 0, 255])).toEqual([1, 0])
    expect(pixelsToVector([255, 255, 255, 255], { invert: true })).toEqual([0])
    expect(pixelsToVector([255, 0, 0, 255], { grayscale: false })).toEqual([1, 0, 0])
  })
})

describe('API errors and rounds', () => {
  it('flattens nested field errors to dotted paths', () => {
    expect(flattenErrors({ name: ['taken'], dp: { target_epsilon: ['too large', 'really'] } })).toEqual({
      name: 'taken',
      'dp.target_epsilon': 'too large really',
    })
  })

  it('maps phase names onto the timeline steps and scores onto percent', () => {
    expect(normalizePhase('Training')).toBe('training')
    expect(normalizePhase('scoring')).toBe('scoring')
    expect(normalizePhase('aggregating')).toBe('aggregating')
    expect(normalizePhase('done')).toBe('done')
    // On chain scoring happens inside "training"; the first score moves the timeline on.
    const training = { phase: 'training', updates: [{ scores: {} }] }
    expect(effectivePhase(training)).toBe('training')
    expect(effectivePhase({ ...training, updates: [{ scores: { '0xm': 8100 } }] })).toBe('scoring')
    expect(formatScore(8123)).toBe('81.2%')
    expect(formatScore(0.5)).toBe('50.0%')
  })

  it('plots accuracy in percent per finished round', () => {
    const option = roundMetricsOption([
      { round: 1, metrics: { accuracy: 0.5, loss: 1.2, epsilon: 0.8 } },
      { round: 2, metrics: {} },
      { round: 3, metrics: { accuracy: 0.81, loss: 0.6, epsilon: 1.6 } },
    ])
    expect(option.xAxis.data).toEqual(['R1', 'R3'])
    expect(option.series[0].data).toEqual([50, 81])
    expect(option.series[2].data).toEqual([0.8, 1.6])
  })
})
