// memoryctl console: the one script (progressive; every page reads and acts without it).
// Asks before a destructive form is sent (forget, drop): a button or form with data-confirm.
"use strict";
document.documentElement.classList.add("js"); // says the script ran (the browser test reads it)
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});
