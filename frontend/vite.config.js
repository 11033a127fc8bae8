import { defineConfig } from 'vite'
import vue from '@vitejs/plugin-vue'
import AutoImport from 'unplugin-auto-import/vite'
import Components from 'unplugin-vue-components/vite'
import { ElementPlusResolver } from 'unplugin-vue-components/resolvers'
import { precompress } from './scripts/precompress.js'

// The build is served by the node's Django app (backend/web) under STATIC_URL,
// so asset URLs start with /static/; index.html itself is served for every client route.
export default defineConfig(({ command }) => ({
  base: command === 'build' ? '/static/' : '/',
  plugins: [
    vue(),
    // Element Plus components and their CSS are imported where used, not globally.
    AutoImport({ resolvers: [ElementPlusResolver()], dts: false }),
    Components({ resolvers: [ElementPlusResolver()], dts: false, dirs: [] }),
    // dist/**/*.{gz,br} beside each asset, served by WhiteNoise with Content-Encoding.
    precompress(),
  ],
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    manifest: true,
    chunkSizeWarningLimit: 700,
  },
  server: {
    // `npm run dev` against a node on :8000
    proxy: { '/api': 'http://127.0.0.1:8000' },
  },
  test: {
    environment: 'happy-dom',
    include: ['tests/**/*.spec.js'],
    setupFiles: ['tests/setup.js'],
    server: { deps: { inline: ['element-plus'] } },
    css: false,
    // Mounting Element Plus pages takes seconds on a loaded 2-core machine: what a test
    // checks is what renders, never how fast (the default 5 s cut one off under load).
    testTimeout: 30000,
  },
}))
