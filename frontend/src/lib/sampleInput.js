// Turns what a user gives the predict form (JSON, a CSV row or an image) into the
// model's input: a list of numeric rows.
export class SampleError extends Error {}

function numericRow(values, where) {
  const row = values.map((value) => Number(typeof value === 'string' ? value.trim() : value))
  if (!row.length || row.some((value) => !Number.isFinite(value))) throw new SampleError(`${where} holds a value that is not a number.`)
  return row
}

export function parseJsonSample(text) {
  let value
  try {
    value = JSON.parse(text)
  } catch {
    throw new SampleError('This is not valid JSON.')
  }
  if (value && !Array.isArray(value) && Array.isArray(value.inputs)) value = value.inputs
  if (!Array.isArray(value) || !value.length) throw new SampleError('Give a list of numbers, or a list of such lists.')
  if (value.every((item) => Array.isArray(item))) return value.map((row, index) => numericRow(row, `Row ${index + 1}`))
  return [numericRow(value, 'The list')]
}

export function parseCsvSample(text) {
  const lines = text
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter(Boolean)
  if (!lines.length) throw new SampleError('The CSV is empty.')
  const rows = lines.map((line) => line.split(/[,;\t]/))
  // A header row (any non-numeric cell) is skipped.
  const isHeader = rows[0].some((cell) => cell.trim() !== '' && !Number.isFinite(Number(cell)))
  const data = isHeader ? rows.slice(1) : rows
  if (!data.length) throw new SampleError('The CSV has a header but no data row.')
  return data.map((row, index) => numericRow(row, `CSV row ${index + 1}`))
}

export function parseTextSample(text) {
  const trimmed = text.trim()
  if (!trimmed) throw new SampleError('Enter a sample.')
  return trimmed.startsWith('[') || trimmed.startsWith('{') ? parseJsonSample(trimmed) : parseCsvSample(trimmed)
}

// Pixels (RGBA bytes) to one row: grayscale luminance or RGB channels, scaled to [0, 1].
export function pixelsToVector(rgba, { grayscale = true, invert = false } = {}) {
  const vector = []
  for (let i = 0; i < rgba.length; i += 4) {
    const channels = grayscale ? [(0.299 * rgba[i] + 0.587 * rgba[i + 1] + 0.114 * rgba[i + 2]) / 255] : [rgba[i] / 255, rgba[i + 1] / 255, rgba[i + 2] / 255]
    for (const value of channels) vector.push(Number((invert ? 1 - value : value).toFixed(4)))
  }
  return vector
}

export async function imageToVector(file, { width = 28, height = 28, grayscale = true, invert = false } = {}) {
  const url = URL.createObjectURL(file)
  try {
    const image = await new Promise((resolve, reject) => {
      const img = new Image()
      img.onload = () => resolve(img)
      img.onerror = () => reject(new SampleError('This file is not an image the browser can read.'))
      img.src = url
    })
    const canvas = document.createElement('canvas')
    canvas.width = width
    canvas.height = height
    const context = canvas.getContext('2d')
    context.drawImage(image, 0, 0, width, height)
    return [pixelsToVector(context.getImageData(0, 0, width, height).data, { grayscale, invert })]
  } finally {
    URL.revokeObjectURL(url)
  }
}

export async function fileToInputs(file, imageOptions) {
  if (file.type.startsWith('image/')) return imageToVector(file, imageOptions)
  const text = await file.text()
  return /\.json$/i.test(file.name) ? parseJsonSample(text) : parseTextSample(text)
}
