// Small inline SVG icons (no icon font, no emoji: the app must look the same on machines
// without an emoji font). Built with createElementNS: no markup strings, nothing inline-styled.

const NS = 'http://www.w3.org/2000/svg';

const PATHS = {
  paperclip: 'M21 12.5l-8.6 8.6a5.5 5.5 0 0 1-7.8-7.8l9.2-9.2a3.7 3.7 0 0 1 5.2 5.2l-9.2 9.2a1.8 1.8 0 0 1-2.6-2.6l8.5-8.5',
  trash: 'M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13M10 11v6M14 11v6',
  file: 'M6 2h8l5 5v15H6zM14 2v5h5',
  image: 'M4 4h16v16H4zM4 16l5-5 4 4 3-3 4 4M15 9.5a1.5 1.5 0 1 0 0-.01',
  doc: 'M6 2h8l5 5v15H6zM14 2v5h5M9 12h6M9 16h6',
  pin: 'M9 3h6l-1 6 3 3H7l3-3zM12 12v9',
};

/** An inline SVG icon (decorative: aria-hidden), sized by CSS (.icon: 1em). */
export function icon(name) {
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('class', `icon icon-${name}`);
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  const path = document.createElementNS(NS, 'path');
  path.setAttribute('d', PATHS[name] || PATHS.file);
  svg.append(path);
  return svg;
}
