// Only the chart types and components the dashboard draws, so the bundle stays small.
import { use, init } from 'echarts/core'
import { GaugeChart, LineChart } from 'echarts/charts'
import { GridComponent, LegendComponent, TooltipComponent, TitleComponent } from 'echarts/components'
import { CanvasRenderer } from 'echarts/renderers'

use([GaugeChart, LineChart, GridComponent, LegendComponent, TooltipComponent, TitleComponent, CanvasRenderer])

export { init }
