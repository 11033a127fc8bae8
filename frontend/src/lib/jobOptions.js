// Choices offered by the job form; they mirror fl_node's registries (models, strategies).
export const MODELS = [
  { value: 'mlp', label: 'MLP (tabular / flattened images)' },
  { value: 'cnn', label: 'CNN (images)' },
  { value: 'text', label: 'Text classifier (token ids)' },
]

export const STRATEGY_GROUPS = [
  {
    label: 'Averaging',
    options: [
      { value: 'fedavg', label: 'FedAvg' },
      { value: 'fedprox', label: 'FedProx' },
      { value: 'fedadam', label: 'FedAdam' },
      { value: 'fedyogi', label: 'FedYogi' },
    ],
  },
  {
    label: 'Robust (defends against poisoned updates)',
    options: [
      { value: 'median', label: 'Coordinate-wise median' },
      { value: 'trimmed_mean', label: 'Trimmed mean' },
      { value: 'krum', label: 'Krum' },
      { value: 'multi_krum', label: 'Multi-Krum' },
      { value: 'hybrid', label: 'Hybrid' },
    ],
  },
]

// The job's defense against a hostile minority (fl_node.robust.DEFENSES); none is an explicit choice.
export const DEFAULT_DEFENSE = 'levelled'
export const DEFENSES = [
  { value: 'levelled', label: 'Levelled (recommended): mixing, and every step at least 3/4 of what the mixed updates back' },
  { value: 'mixing', label: 'Mixing: committee defenses and steps bounded by the median of mixed updates' },
  { value: 'robust', label: 'Robust: committee defenses and steps bounded by the median' },
  { value: 'committee', label: 'Committee: clipped relative scores, median-norm clip, sign vote' },
  { value: 'none', label: 'None (no defense)' },
]

export const DP_MODES = [
  { value: 'none', label: 'None' },
  { value: 'sgd', label: 'DP-SGD (per-sample clipping + noise)' },
  { value: 'update', label: 'Update-level Gaussian mechanism' },
]

// 'drawing': started, the participants reveal their draw secrets before the first committee is drawn.
export const ACTIVE_JOB_STATUSES = ['created', 'pending', 'open', 'joining', 'drawing', 'running', 'training', 'active', 'started']

export function isActiveJob(job) {
  return ACTIVE_JOB_STATUSES.includes(String(job?.status || '').toLowerCase())
}
