import { describe, it, expect, vi, beforeEach } from 'vitest'
import { mount } from '@vue/test-utils'
import { settle } from './helpers.js'

vi.mock('../src/lib/api.js', async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, api: { jobTasks: vi.fn(), cancelTask: vi.fn(), setJobPriority: vi.fn() } }
})

import TasksPanel from '../src/components/jobs/TasksPanel.vue'
import { api, ApiError } from '../src/lib/api.js'

const task = (id, round, state, over = {}) => ({
  id, job_id: 7, round, kind: 'train', state, priority: 2, queue_position: null, attempts: 1, max_attempts: 3,
  next_retry_at: null, cancel_requested: false, worker: 'w1@box', device: 'cpu', amount: 1, created: '2026-12-01T05:00:00Z',
  started_at: '2026-12-01T05:00:01Z', finished_at: null, wait_s: 0.5, duration_s: null, error: '', log: '', ...over,
})

describe('TasksPanel', () => {
  beforeEach(() => {
    vi.clearAllMocks()
    api.jobTasks.mockResolvedValue({
      job_id: 7,
      priority: 2,
      tasks: [task(3, 4, 'running'), task(2, 3, 'queued', { queue_position: 1 }), task(1, 2, 'failed', { attempts: 3, error: 'OSError: disk full' })],
    })
  })

  it('lists the tasks with queue position and attempts, and offers Cancel only on open tasks to an operator', async () => {
    const wrapper = mount(TasksPanel, { props: { jobId: '7', canOperate: true }, attachTo: document.body })
    await settle()
    const rows = wrapper.findAll('[data-test=tasks-table] .el-table__body tr.el-table__row')
    expect(rows).toHaveLength(3)
    expect(rows[1].text()).toContain('queued')
    expect(rows[2].text()).toContain('3/3')
    expect(wrapper.find('[data-test=cancel-task-3]').exists()).toBe(true)
    expect(wrapper.find('[data-test=cancel-task-2]').exists()).toBe(true)
    expect(wrapper.find('[data-test=cancel-task-1]').exists()).toBe(false)
    api.cancelTask.mockRejectedValue(new ApiError(409, 'task 2 is cancelled: only queued or running tasks can be cancelled'))
    await wrapper.find('[data-test=cancel-task-2]').trigger('click')
    await settle()
    expect(api.cancelTask).toHaveBeenCalledWith('7', 2)
    expect(document.body.textContent).toContain('only queued or running tasks can be cancelled')
    wrapper.unmount()
  })

  it('shows a viewer the priority but no control and no Cancel', async () => {
    const wrapper = mount(TasksPanel, { props: { jobId: '7', canOperate: false }, attachTo: document.body })
    await settle()
    expect(wrapper.find('[data-test=priority-value]').text()).toBe('2')
    expect(wrapper.find('[data-test=priority-save]').exists()).toBe(false)
    expect(wrapper.findAll('[data-test^=cancel-task-]')).toHaveLength(0)
    wrapper.unmount()
  })
})
