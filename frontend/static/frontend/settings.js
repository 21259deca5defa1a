// Per-browser settings of the chat app, kept in localStorage:
//   theme: 'system' (default: follows prefers-color-scheme) | 'light' | 'dark'
//   showModelNotices: 'on' | 'off' | '' (default: on for workspace admins, off for members):
//     whether a run's model retries and fallbacks show as a folded line above the reply.
// The theme is applied as <html data-theme="light|dark"> (app.css has both palettes; with
// 'system' the attribute is removed and the media query decides).

const KEY = 'agent-platform.settings';

function read() {
  try {
    const value = JSON.parse(window.localStorage.getItem(KEY) || '{}');
    return value && typeof value === 'object' ? value : {};
  } catch {
    return {};
  }
}

function write(values) {
  try {
    window.localStorage.setItem(KEY, JSON.stringify(values));
  } catch {
    // private mode or storage full: the setting lasts for this page only
  }
}

const THEMES = new Set(['system', 'light', 'dark']);
const listeners = new Set();

export const settings = {
  /** 'system' | 'light' | 'dark' */
  theme() {
    const t = read().theme;
    return THEMES.has(t) ? t : 'system';
  },
  setTheme(theme) {
    write({ ...read(), theme: THEMES.has(theme) ? theme : 'system' });
    applyTheme();
    listeners.forEach((fn) => fn());
  },
  /** Whether retries and fallbacks are shown (default: admins yes, members no). */
  showModelNotices(isAdmin) {
    const v = read().showModelNotices;
    return v === 'on' ? true : v === 'off' ? false : !!isAdmin;
  },
  setShowModelNotices(on) {
    write({ ...read(), showModelNotices: on ? 'on' : 'off' });
    listeners.forEach((fn) => fn());
  },
  /** Agent ids pinned in the New chat picker. */
  pinnedAgents() {
    const p = read().pinnedAgents;
    return Array.isArray(p) ? p.map(String) : [];
  },
  togglePinnedAgent(id) {
    const pins = new Set(settings.pinnedAgents());
    if (pins.has(String(id))) pins.delete(String(id));
    else pins.add(String(id));
    write({ ...read(), pinnedAgents: [...pins].slice(0, 50) });
  },
  onChange(fn) {
    listeners.add(fn);
    return () => listeners.delete(fn);
  },
};

/** Put the chosen theme on <html> (call once at boot and after a change). */
export function applyTheme() {
  const theme = settings.theme();
  const root = document.documentElement;
  if (theme === 'system') root.removeAttribute('data-theme');
  else root.dataset.theme = theme;
}
