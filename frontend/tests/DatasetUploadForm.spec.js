import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, api: { uploadDataset: vi.fn(), jobLimits: vi.fn(async () => ({ max_upload_bytes: 1000, max_epsilon_cap: 100 })) } }
})

import DatasetUploadForm from '../src/components/datasets/DatasetUploadForm.vue'
import { api, ApiError } from '../src/lib/api.js'

const errorIn = (wrapper, field) => wrapper.find(`[data-test=field-${field}] .el-form-item__error`)

async function fillAndSubmit(wrapper, { file = new File(['a,b,label\n1,2,0\n'], 'clinic.csv', { type: 'text/csv' }), label = 'label', classes = '0,1' } = {}) {
  const input = wrapper.find('input[data-test=file-input]')
  Object.defineProperty(input.element, 'files', { value: file ? [file] : [], configurable: true })
  await input.trigger('change')
  await wrapper.find('input[data-test=label-input]').setValue(label)
  await wrapper.find('input[data-test=classes-input]').setValue(classes)
  await wrapper.find('form').trigger('submit')
  await settle()
}

describe('DatasetUploadForm', () => {
  it('says what the file must look like and the node\'s bounds before anything is sent', async () => {
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await settle()
    const help = wrapper.find('[data-test=upload-help]').text()
    expect(help).toContain('a header row naming the columns')
    expect(help).toContain('1/(10·n)')
    expect(wrapper.find('[data-test=upload-max-cap]').text()).toBe('100')
    expect(wrapper.find('[data-test=upload-max-size]').text()).toBe('1000 B')
    wrapper.unmount()
  })

  it('refuses a file over the node\'s limit before uploading it', async () => {
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await settle()
    await fillAndSubmit(wrapper, { file: new File(['x'.repeat(2000)], 'big.csv', { type: 'text/csv' }) })
    expect(api.uploadDataset).not.toHaveBeenCalled()
    expect(errorIn(wrapper, 'file').text()).toContain('at most 1000 B')
    wrapper.unmount()
  })

  it('counts a CSV\'s records and holds δ to 1/(10·n) for them', async () => {
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await settle()
    const rows = ['a,label', ...Array.from({ length: 50 }, (_, i) => `${i},${i % 2}`)].join('\n')
    await fillAndSubmit(wrapper, { file: new File([rows], 'small.csv', { type: 'text/csv' }) })
    await settle()
    expect(wrapper.find('[data-test=upload-delta-rule]').text()).toBe('50 records: δ at most 2e-3')
    wrapper.unmount()
  })

  beforeEach(() => {
    api.uploadDataset.mockReset()
  })

  it('shows the API 400 errors next to the fields they concern', async () => {
    api.uploadDataset.mockRejectedValue(
      new ApiError(400, 'label_column: no column named "label"', {
        label_column: ['no column named "label"'],
        name: ['a dataset with this name exists'],
      }),
    )
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await fillAndSubmit(wrapper)
    expect(api.uploadDataset).toHaveBeenCalledTimes(1)
    expect(errorIn(wrapper, 'label_column').text()).toBe('no column named "label"')
    expect(errorIn(wrapper, 'name').text()).toBe('a dataset with this name exists')
    expect(errorIn(wrapper, 'epsilon_cap').exists()).toBe(false)
    // The detail only repeats the first field error, so it is not shown twice.
    expect(wrapper.find('[data-test=upload-error]').exists()).toBe(false)
    expect(wrapper.find('[data-test=upload-progress]').exists()).toBe(false)
    wrapper.unmount()
  })

  it('shows an error that concerns no field above the submit button', async () => {
    api.uploadDataset.mockRejectedValue(new ApiError(409, 'this dataset is stored already'))
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await fillAndSubmit(wrapper)
    expect(wrapper.find('[data-test=upload-error]').text()).toContain('this dataset is stored already')
    expect(wrapper.findAll('.el-form-item.is-error')).toHaveLength(0)
    wrapper.unmount()
  })

  it('sends the form as multipart, shows upload progress and reports the stored dataset', async () => {
    let sent
    let finish
    api.uploadDataset.mockImplementation(async (form, onProgress) => {
      sent = form
      onProgress(40)
      await new Promise((resolve) => (finish = resolve))
      return { id: 7, name: 'clinic' }
    })
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await fillAndSubmit(wrapper)
    const progress = () => wrapper.find('[data-test=upload-progress]')
    expect(progress().attributes('aria-valuenow')).toBe('40')
    expect(wrapper.find('[data-test=upload-submit]').text()).toBe('Uploading…')
    expect(sent.get('name')).toBe('clinic')
    expect(sent.get('format')).toBe('csv')
    expect(sent.get('label_column')).toBe('label')
    expect(sent.get('classes')).toBe('0,1')
    expect(sent.get('epsilon_cap')).toBe('3')
    expect(sent.get('delta')).toBe('0.00001')
    expect(sent.get('file').name).toBe('clinic.csv')
    finish()
    await settle()
    expect(wrapper.emitted('uploaded')[0][0]).toEqual({ id: 7, name: 'clinic' })
    expect(progress().attributes('aria-valuenow')).toBe('100')
    wrapper.unmount()
  })

  it('catches a missing file, label column and class list before uploading', async () => {
    const wrapper = mount(DatasetUploadForm, { attachTo: document.body })
    await fillAndSubmit(wrapper, { file: null, label: '', classes: ' , ' })
    expect(api.uploadDataset).not.toHaveBeenCalled()
    expect(errorIn(wrapper, 'file').text()).toContain('Choose a CSV or NPZ file')
    expect(errorIn(wrapper, 'label_column').text()).toContain('labels')
    expect(errorIn(wrapper, 'classes').text()).toContain('class names')
    expect(errorIn(wrapper, 'name').text()).toContain('name')
    wrapper.unmount()
  })
})
