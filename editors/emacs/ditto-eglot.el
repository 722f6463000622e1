;;; ditto-eglot.el --- Ditto suggestions in Emacs through eglot  -*- lexical-binding: t; -*-

;; Eglot (Emacs 29+ built in; Emacs 28: the elpa-eglot package or M-x package-install eglot) has no
;; inline completion, so Ditto's suggestion arrives through the completion fallback
;; (textDocument/completion): M-x completion-at-point (C-M-i), or company / corfu popups.
;; Eglot runs one server per buffer, so these modes use Ditto instead of another language server.

(require 'eglot)

;; Eglot's completion request is synchronous and gives up after `jsonrpc-default-request-timeout'
;; (10 s) with a "Timed out" error. A request made while the model loads waits for it
;; (loadWaitS, 120 s by default); 8 s keeps that wait inside eglot's, so a completion asked for
;; during loading ends with no suggestion instead of an error.
(add-to-list 'eglot-server-programs
             '((python-mode js-mode typescript-mode c-mode c++-mode go-mode rust-mode sh-mode)
               . ("ditto-lsp" "serve"
                  :initializationOptions (:model "default" :drafter "ngram" :loadWaitS 8))))

(add-hook 'python-mode-hook #'eglot-ensure)

(provide 'ditto-eglot)
;;; ditto-eglot.el ends here
