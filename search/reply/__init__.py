"""Reply drafts for a patient's portal message: the questions in it, the note sentences and coded
records that answer them, and a short, plain-language draft whose every sentence cites them."""
