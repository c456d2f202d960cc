(function(){
  "use strict";
  var table=document.getElementById("gate-table");
  if(table){
    var body=table.tBodies[0], dir={};
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
      th.addEventListener("click",function(){
        dir[i]=-(dir[i]||-1);
        var rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=a.cells[i].getAttribute("data-v")||a.cells[i].textContent,y=b.cells[i].getAttribute("data-v")||b.cells[i].textContent;
          var nx=parseFloat(x),ny=parseFloat(y);
          var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:x.localeCompare(y);
          return c*dir[i];
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
    var filter=document.getElementById("gate-filter"),status=document.getElementById("status-filter");
    var apply=function(){
      var q=filter.value.toLowerCase(),s=status.value;
      Array.prototype.forEach.call(body.rows,function(r){
        var ok=(!q||r.textContent.toLowerCase().indexOf(q)>=0)&&(!s||r.getAttribute("data-status")===s);
        r.style.display=ok?"":"none";
      });
    };
    filter.addEventListener("input",apply);status.addEventListener("change",apply);
  }
  var search=document.getElementById("log-search");
  if(search){
    var logs=document.querySelectorAll("details.gate-log");
    var originals=[];
    Array.prototype.forEach.call(logs,function(d){var p=d.querySelector("pre");originals.push(p?p.innerHTML:null);});
    var escapeRe=function(s){return s.replace(/[.*+?^${}()|[\]\\]/g,"\\$&");};
    search.addEventListener("input",function(){
      var q=search.value, n=0;
      Array.prototype.forEach.call(logs,function(d,i){
        var pre=d.querySelector("pre");
        if(!pre){d.style.display=q?"none":"";return;}
        pre.innerHTML=originals[i];
        if(!q){d.style.display="";return;}
        var hit=pre.textContent.toLowerCase().indexOf(q.toLowerCase())>=0;
        d.style.display=hit?"":"none";
        if(hit){
          d.open=true;n++;
          var re=new RegExp("("+escapeRe(q.replace(/&/g,"&amp;").replace(/</g,"&lt;").replace(/>/g,"&gt;"))+")(?![^<]*>)","gi");
          pre.innerHTML=originals[i].replace(re,"<mark>$1</mark>");
        }
      });
      document.getElementById("log-hits").textContent=q?(n+" log(s) match"):"";
    });
  }
  var tip=document.getElementById("dag-tip");
  Array.prototype.forEach.call(document.querySelectorAll(".node"),function(g){
    var show=function(){tip.textContent=g.getAttribute("data-tip");};
    g.addEventListener("focus",show);g.addEventListener("mouseenter",show);
  });
})();
