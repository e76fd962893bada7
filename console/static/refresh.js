// refresh.js keeps a rollouts page live without reloading it: every two
// seconds it fetches the page again and swaps in its #refresh element,
// until that element says the rollout is final (data-final="1").
(function () {
  const el = document.getElementById('refresh');
  if (!el || el.dataset.final === '1') return;
  const timer = setInterval(async () => {
    try {
      const r = await fetch(location.href, { cache: 'no-store' });
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
      const next = doc.getElementById('refresh');
      if (!next) return;
      el.innerHTML = next.innerHTML;
      if (next.dataset.final === '1') {
        el.dataset.final = '1';
        clearInterval(timer);
      }
    } catch (e) { /* the next try may work */ }
  }, 2000);
})();
